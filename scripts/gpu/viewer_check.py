"""Opens every snapshot the GPU run wrote (memory_csv_data/*.pickle and the test's) with
PyTorch's viewer code and prints its totals; fails if one does not load."""
import glob
import pickle
import sys

from torch.cuda import _memory_viz as mv

paths = sorted(glob.glob("memory_csv_data/*.pickle") + glob.glob("out/*.pickle"))
if not paths:
    print("no snapshot found (expected OOM snapshots from leak_hunt/cuda_test runs)")
for p in paths:
    with open(p, "rb") as f:
        data = pickle.load(f)
    mv.segsum(data)
    mv.trace_plot(data)
    active = sum(mv.calc_active(s) for s in data["segments"])
    print(f"{p}: {len(data['segments'])} segments, {active} active bytes, "
          f"{sum(len(t) for t in data['device_traces'])} trace entries")
sys.exit(0)
