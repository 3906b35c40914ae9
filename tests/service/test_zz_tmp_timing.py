import json, time, sys, subprocess
from pathlib import Path
import yaml
REPO = Path(__file__).resolve().parents[2]
from test_cluster_sweeps import tiny, critbatch

def test_one(cluster_env, tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(tiny("timing")))
    t = time.time()
    r = critbatch(cluster_env, "submit", str(p), "--wait", timeout=900)
    print("ELAPSED", time.time() - t, r.returncode)
    print(r.stdout[-2000:], r.stderr[-3000:])
    sid = r.stdout.split("submitted sweep ", 1)[1].split()[0]
    print(critbatch(cluster_env, "logs", sid).stdout[-6000:])
