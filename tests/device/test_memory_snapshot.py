"""Memory snapshots as torch.cuda.memory has them: a user records the memory history of a
training step on tpu, takes `torch.tpu.memory._snapshot()` and dumps it for the visualiser.
The snapshot has a segment per live allocation made while recording, with the user's frames,
and a trace of allocs, frees and the OOM; torch's own `_memory_viz` reads it; recording
stops; `torch.tpu.memory_summary()` prints the counters."""
import pytest
from helpers.user_script import run_script

BODY = r'''
import pickle
import torch.nn as nn
from torch.cuda import _memory_viz

model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to("tpu")
opt = torch.optim.AdamW(model.parameters())
torch.tpu.memory._record_memory_history(max_entries=100000)


def train_step(x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


for _ in range(2):
    train_step(torch.randn(32, 64, device="tpu"), torch.randint(0, 10, (32,), device="tpu"))
try:
    huge = torch.empty(512 * 2**20, dtype=torch.uint8, device="tpu")  # past the 256 MiB limit
except torch.OutOfMemoryError:
    out["oom_raised"] = True
snap = torch.tpu.memory._snapshot()
path = os.path.join(os.environ["SNAP_DIR"], "snap.pickle")
torch.tpu.memory._dump_snapshot(path)
with open(path, "rb") as f:
    loaded = pickle.load(f)
torch.tpu.memory._record_memory_history(enabled=None)
events = len(snap["device_traces"][0])
extra = torch.randn(1000, device="tpu")  # not recorded
out["trace_after_stop"] = len(torch.tpu.memory._snapshot()["device_traces"][0]) - events
out["segments"] = len(snap["segments"])
out["segment_bytes"] = sum(s["total_size"] for s in snap["segments"])
out["blocks_per_segment"] = sorted({len(s["blocks"]) for s in snap["segments"]})
out["actions"] = sorted({e["action"] for e in snap["device_traces"][0]})
out["oom_size"] = [e["size"] for e in snap["device_traces"][0] if e["action"] == "oom"]
out["user_frames"] = sorted({f["name"] for s in snap["segments"] for b in s["blocks"]
                             for f in b["frames"] if f["filename"] == __file__})
out["trace_user_frames"] = sorted({f["name"] for e in snap["device_traces"][0]
                                   for f in e["frames"] if f["filename"] == __file__})
out["loaded_equal"] = loaded["segments"] == snap["segments"]
out["allocated"] = torch.tpu.memory_allocated()
out["viz_html"] = len(_memory_viz.trace_plot(snap)) > 1000
out["segsum"] = "total_allocated" in _memory_viz.segsum(snap)
out["summary"] = torch.tpu.memory_summary()
out["same_module"] = torch.tpu.memory.memory_allocated is torch.tpu.memory_allocated
'''


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_snapshot_of_a_training_step(mode, tmp_path, monkeypatch):
    monkeypatch.setenv("SNAP_DIR", str(tmp_path))
    out = run_script(BODY, mode)
    assert out["oom_raised"]
    assert out["segments"] >= 6            # AdamW's state, the gradients, the step's tensors
    assert out["blocks_per_segment"] == [1]
    assert 0 < out["segment_bytes"] <= out["allocated"]
    assert out["actions"] == ["alloc", "free_completed", "oom"]
    assert out["oom_size"] == [512 * 2**20]
    assert "train_step" in out["user_frames"] and "<module>" in out["user_frames"]
    assert "train_step" in out["trace_user_frames"]
    assert out["loaded_equal"] and out["viz_html"] and out["segsum"] and out["same_module"]
    assert out["trace_after_stop"] == 0
    assert "Allocated memory" in out["summary"] and "OOMs: 1" in out["summary"]
