#!/usr/bin/env python3
# What checkpoints cost a server: 40 jobs of 50 steps submitted at once to `serve --workers 2
# --patches 16`, time until all succeeded, with --ephemeral, a state directory (default
# checkpoint interval) and a checkpoint at every step; 3 interleaved rounds, medians.
# Usage: cargo build --release --bin flashdiff && python3 scripts/checkpoint_cost.py
import subprocess, json, time, urllib.request, sys, re, os, shutil
def run(args, n=40):
    p = subprocess.Popen([os.environ.get("FLASHDIFF", "target/release/flashdiff"),"serve","--port","0","--workers","2","--patches","16"]+args,
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    while True:
        line = p.stderr.readline()
        if "http://" in line: break
    base = "http://" + line.split("http://")[1].split()[0]
    t0 = time.time()
    ids = []
    for i in range(n):
        req = urllib.request.Request(base+"/v1/jobs", data=json.dumps({"prompt":"a red circle top left and a blue square bottom right on a white background","seed":i}).encode(), headers={"content-type":"application/json"})
        ids.append(json.load(urllib.request.urlopen(req))["id"])
    done=set()
    while len(done)<n:
        for i in ids:
            if i in done: continue
            v=json.load(urllib.request.urlopen(base+f"/v1/jobs/{i}"))
            if v["state"]=="succeeded": done.add(i)
        time.sleep(0.05)
    dt=time.time()-t0
    p.kill(); p.wait()
    return dt
home_state=os.path.expanduser("~/.local/state/flashdiff-bench")
shm_state="/dev/shm/fd-bench-state"
res={"ephemeral":[], "disk":[], "disk-every-step":[]}
for rep in range(3):
    for k in ["ephemeral","disk","disk-every-step"]:
        for d in [home_state, shm_state]: shutil.rmtree(d, ignore_errors=True)
        args = ["--ephemeral"] if k=="ephemeral" else ["--state-dir", home_state] + (["--checkpoint-every-ms","0"] if k=="disk-every-step" else [])
        res[k].append(run(args))
        print(k, round(res[k][-1],2), flush=True)
for k,v in res.items(): print(k, "median", sorted(v)[1], v)
