# Learned proposers: the frozen target's labels and hidden states over the chat set, from one
# prefill cached once, then one resumable training job per checkpoint
# (checkpoints/<method>/<name>/, manifest.json written last).


rule hidden_states:
    input:
        target=TARGET,
        train="data/chat/train.jsonl",
        heldout=DATASET_FILES["chat_heldout"],
        code=code("hidden-states"),
    output:
        HIDDEN,
    params:
        target=target_dir,
        taps=" ".join(str(t) for t in config.get("train", {}).get("hidden", {}).get("taps", [])),
        h=config.get("train", {}).get("hidden", {}),
        device=config["device"],
        threads=config["threads"],
    threads: rule_threads("hidden_states")
    resources:
        **rule_resources("hidden_states"),
    conda:
        CONDA_ENV
    log:
        "logs/hidden_states/chat.log",
    benchmark:
        "benchmarks/hidden_states/chat.tsv",
    shell:
        "python -m specdec hidden-states --target {params.target}"
        " --split train={input.train} --split heldout={input.heldout} --taps {params.taps}"
        " --dtype {params.h[dtype]} --store-dtype {params.h[store_dtype]} --batch-size {params.h[batch_size]}"
        " --soft-topk {params.h[soft_topk]}"
        " --device {params.device}"
        " --threads {params.threads} --out {output} 2>&1 | tee {log}"


# the ablation's rows before on-policy data train on the reference replies' states (held-out: the
# same greedy completions as every other row's), with hard labels (they come before soft labels:
# no soft labels are stored)
use rule hidden_states as hidden_states_reference with:
    input:
        target=TARGET,
        train="data/ablation/chat_reference.jsonl",
        heldout=DATASET_FILES["chat_heldout"],
        code=code("hidden-states"),
    output:
        ABLATION_HIDDEN,
    params:   # merged into hidden_states' params by keyword
        h={**config.get("train", {}).get("hidden", {}), "soft_topk": 0},
    log:
        "logs/hidden_states/chat_reference.log",
    benchmark:
        "benchmarks/hidden_states/chat_reference.tsv"


rule train_proposer:
    input:
        hidden=lambda wc: PLAN.checkpoint_hidden(wc.method, wc.name),
        target=TARGET,
        code=code("train"),
        method_code=lambda wc: PLAN.method_sources(wc.method),
        init=lambda wc: PLAN.init_checkpoint(wc.method, wc.name),
        spec=job_spec("train_proposer", "method", "name"),
    output:
        # config.json and model.safetensors are written first; resume.pt (not an output) survives
        # an interrupted run, and the rerun continues from it
        "checkpoints/{method}/{name}/manifest.json",
    params:
        target=target_dir,
        overlap=config["data"]["chat"]["eval_overlap_prompts"],
        device=config["device"],
        threads=config["threads"],
    threads: rule_threads("train_proposer")
    resources:
        **rule_resources("train_proposer"),
    conda:
        CONDA_ENV
    log:
        "logs/train_proposer/{method}-{name}.log",
    benchmark:
        "benchmarks/train_proposer/{method}-{name}.tsv",
    shell:
        "python -m specdec train --method {wildcards.method} --hidden {input.hidden} --target {params.target}"
        " --spec {input.spec} --overlap {params.overlap} --device {params.device} --threads {params.threads}"
        " --out-dir checkpoints/{wildcards.method}/{wildcards.name} 2>&1 | tee {log}"
