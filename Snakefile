# Speculative decoding from scratch, benchmarked behind one shared decoding contract.
# Default: the embedded CPU config (SmolLM2-135M-Instruct). Full scale:
#   snakemake results/tables.md --cores 1 --configfile workflow/configs/full-scale.yaml
from snakemake.utils import min_version, validate

min_version("8.0")


# A --configfile replaces config.yaml instead of being merged into it: each config is complete.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


envvars:
    "PATH",


validate(config, "workflow/schemas/config.schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/vllm.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/tables.md",
