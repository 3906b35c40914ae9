import json, time
import yaml
from test_cluster_sweeps import tiny, critbatch

def test_fail(cluster_env, tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(tiny("svc-fail", batch_warmup={"schedule": [[0, 1], [2048, 16]]},
                                             search={**tiny("x")["search"], "batch_sizes_sequences": [4]})))
    r = critbatch(cluster_env, "submit", str(p), "--wait", "--sweep-id", "f1", timeout=900)
    print(r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    print(critbatch(cluster_env, "status", "f1", "--json").stdout)
    print(critbatch(cluster_env, "logs", "f1").stdout[-300:])
    from test_cluster_sweeps import mlflow_runs
    for run in mlflow_runs(cluster_env["MLFLOW_TRACKING_URI"], "f1"):
        print(run.info.run_name, run.info.status, run.data.tags)
