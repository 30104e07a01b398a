# Each job's structured parameters (its arms, rows or settings), written by the planner
# (specdec.plan.job_spec) to the file the job reads with --spec: no JSON crosses a shell, and the
# file shows what a job ran. A change in the plan changes this job's params, which Snakemake reruns
# it for; the new file then makes the job that reads it stale.


wildcard_constraints:
    spec_rule="[a-z_]+",


rule job_spec:
    output:
        "results/specs/{spec_rule}/{key}.json",
    params:
        spec=lambda wc: PLAN.job_spec(wc.spec_rule, wc.key),
    localrule: True
    log:
        "logs/job_spec/{spec_rule}/{key}.log",
    run:
        write_spec(params.spec, output[0], log[0])
