#!/usr/bin/env bash
# Prints the GPU machine's environment and copies the installed sources that define the
# reference numerics (transformers' Qwen3-VL, its processors, FP8 integration, torchvision
# resize) into $OUT/sources.tar.gz, so numeric details are read from what actually runs.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
{
  uname -a; cat /etc/os-release | head -4; ldd --version | head -1
  gcc --version | head -1; g++ --version | head -1; nvcc --version | tail -2; cmake --version | head -1
  nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv
  nproc; free -g
  python3 - <<'PY'
import importlib
for m in ["torch", "transformers", "tokenizers", "torchvision", "PIL", "numpy", "safetensors", "kernels", "deep_gemm", "jinja2"]:
    try:
        mod = importlib.import_module(m); print(m, getattr(mod, "__version__", "?"), getattr(mod, "__file__", ""))
    except Exception as e:
        print(m, "MISSING", type(e).__name__)
PY
  ls /usr/local/cuda/lib64 | grep -E "cublas|cudart|cudnn" | head -20
} > "$out/env.txt" 2>&1
python3 - <<'PY'
import os, tarfile, importlib
out = os.environ.get("OUT", "/tmp/out")
import transformers, torchvision
troot = os.path.dirname(transformers.__file__)
vroot = os.path.dirname(torchvision.__file__)
files = []
for rel in ["models/qwen3_vl", "models/qwen2_vl", "vision_utils.py", "image_processing_backends.py",
            "image_transforms.py", "image_utils.py", "masking_utils.py", "integrations/finegrained_fp8.py",
            "quantizers/quantizer_finegrained_fp8.py", "modeling_rope_utils.py", "processing_utils.py",
            "image_processing_utils.py", "image_processing_utils_fast.py", "generation/logits_process.py",
            "integrations/sdpa_attention.py", "activations.py", "utils/quantization_config.py"]:
    p = os.path.join(troot, rel)
    if os.path.exists(p): files.append((p, "transformers/" + rel))
for rel in ["transforms/v2/functional/_geometry.py", "transforms/v2/functional/_color.py", "transforms/functional.py"]:
    p = os.path.join(vroot, rel)
    if os.path.exists(p): files.append((p, "torchvision/" + rel))
with tarfile.open(os.path.join(out, "sources.tar.gz"), "w:gz") as t:
    for p, name in files:
        t.add(p, arcname=name, filter=lambda ti: None if ti.name.endswith(".pyc") or "__pycache__" in ti.name else ti)
print("packed", len(files))
PY
cat "$out/env.txt"
