# Speculative decoding from scratch, benchmarked behind one shared decoding contract.
# Default: the embedded CPU config (SmolLM2-135M-Instruct). Full scale:
#   snakemake results/tables.md --cores 1 --configfile workflow/configs/full-scale.yaml
import sys
from pathlib import Path

from snakemake.common.configfile import load_configfile
from snakemake.utils import min_version, update_config, validate

min_version("8.0")


# A --configfile replaces config.yaml instead of being merged into it: each config is complete.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# The default's size on this host class (config `sizing`): on a CPU without native bf16 matmuls,
# where every forward runs in fp32 at about half the speed, sizing.float32 replaces the keys it
# names in the first config file. What is layered on top of that file (a later --configfile, then
# --config) still wins, so those layers are merged again after the sizing. The merged config is
# what the schema checks and the jobs read.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from specdec.host import sizing  # noqa: E402

SIZED_FOR, SIZING = sizing(config)
for layer in [SIZING, *map(load_configfile, workflow.overwrite_configfiles[1:]), workflow.config_settings.config]:
    update_config(config, layer)


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
include: "workflow/rules/llamacpp.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/tables.md",
