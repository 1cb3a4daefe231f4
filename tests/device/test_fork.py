"""Fork safety as CUDA has it: a child forked after the parent used tpu raises at once
("Cannot re-initialize tpu in forked subprocess ... 'spawn' start method"), never hangs;
DataLoader workers that make CPU tensors keep working (src/torch_tpu/_runtime.py).

Each case is a user script in its own process, bounded by a timeout: a hang fails it.
"""
import pytest

from helpers.user_script import run_script

MODES = ["strict", "defer_and_fuse"]
FORK_ERROR = ("Cannot re-initialize tpu in forked subprocess. To use tpu with "
              "multiprocessing, you must use the 'spawn' start method")


def run(body: str, mode: str = "strict", timeout=180, fork_helper=False) -> dict:
    return run_script(body, mode, prelude=_TRY_IN_CHILD if fork_helper else "",
                      timeout=timeout)


# In the child: each way of touching tpu, reported back through a pipe. A hang would
# leave the parent's read waiting until the 20 s alarm kills the child.
_TRY_IN_CHILD = """
def in_child(step):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        import signal
        signal.alarm(20)
        t0 = time.perf_counter()
        try:
            value = step()
            res = {"raised": None, "value": value if isinstance(value, float) else None}
        except BaseException as e:
            res = {"raised": type(e).__name__, "message": str(e)}
        res["seconds"] = time.perf_counter() - t0
        res["bad_fork"] = torch.tpu._is_in_bad_fork()
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"raised": "no answer: killed (a hang)"}
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_forked_child_that_touches_tpu_raises_at_once(mode):
    out = run("""
        x = torch.ones(4, device="tpu") + 1
        x.sum().item()
        y = x * 3  # pending in DeferAndFuse at the fork
        steps = {
            "factory": lambda: torch.ones(3, device="tpu"),
            "upload": lambda: torch.arange(3).to("tpu"),
            "op": lambda: x + 1,
            "in_place": lambda: x.add_(1),
            "read": lambda: x.cpu(),
            "read_pending": lambda: y.tolist(),
            "print": lambda: print(x),
            "item": lambda: x.sum().item(),
            "synchronize": lambda: torch.tpu.synchronize(),
            "empty": lambda: torch.empty(0, device="tpu"),
        }
        out["child"] = {name: in_child(step) for name, step in steps.items()}
        out["parent_bad_fork"] = torch.tpu._is_in_bad_fork()
        out["parent_after"] = (x + y).tolist()  # the parent is unaffected
    """, mode, fork_helper=True)
    for name, res in out["child"].items():
        assert res["raised"] == "RuntimeError" and res["message"] == FORK_ERROR, (name, res)
        assert res["seconds"] < 1 and res["bad_fork"], (name, res)
    assert out["parent_bad_fork"] is False and out["parent_after"] == [8.0] * 4
    assert "os.fork() was called" not in out["stderr"]  # JAX's deadlock warning: not here


def test_multiprocessing_fork_child_gets_the_cuda_message():
    out = run("""
        import multiprocessing as mp

        def work(q):
            try:
                q.put(("ok", torch.ones(2, device="tpu").sum().item()))
            except RuntimeError as e:
                q.put(("raised", str(e)))

        torch.ones(2, device="tpu").sum().item()
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=work, args=(q,))
        t0 = time.perf_counter()
        p.start()
        out["answer"] = q.get(timeout=30)
        p.join(30)
        out["seconds"] = time.perf_counter() - t0
        out["exitcode"] = p.exitcode
    """)
    assert out["answer"] == ["raised", FORK_ERROR] and out["exitcode"] == 0
    assert out["seconds"] < 10


def test_a_child_of_a_parent_that_never_started_tpu_may_use_it():
    """Only a started runtime makes a bad fork: a parent that imported torch_tpu but made
    no tpu tensor (the first one starts the device, as on CUDA) leaves the child free to
    start its own."""
    out = run("""
        from torch_tpu import _runtime
        out["parent_started"] = _runtime.started()
        out["child"] = in_child(lambda: torch.ones(3, device="tpu").sum().item())
    """, fork_helper=True)
    assert out["parent_started"] is False
    assert out["child"]["raised"] is None and out["child"]["value"] == 3.0
    assert out["child"]["bad_fork"] is False


@pytest.mark.parametrize("mode", MODES)
def test_dataloader_workers(mode):
    """After the parent used tpu: workers that make CPU tensors keep working, pinned or
    not, over two epochs; workers whose dataset makes tpu tensors (a CUDA script's
    mistake) fail at once, as with CUDA, and the DataLoader re-raises, never times out."""
    out = run("""
        from torch.utils.data import DataLoader, Dataset

        class Squares(Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                torch.manual_seed(i)  # seeding in a worker skips tpu (_is_in_bad_fork)
                return torch.full((3,), float(i * i)), torch.randn(2).shape[0]

        class OnDevice(Squares):
            def __getitem__(self, i):
                return torch.full((3,), float(i), device="tpu")

        w = torch.ones(3, device="tpu")
        w.sum().item()  # the parent has started tpu
        for pin_memory in (False, True):
            loader = DataLoader(Squares(), batch_size=4, num_workers=2, pin_memory=pin_memory,
                                multiprocessing_context="fork", timeout=60)
            total = torch.zeros(3, device="tpu")
            pinned = set()
            for epoch in range(2):
                for batch, n in loader:
                    pinned.add(batch.is_pinned())
                    total = total + (batch.to("tpu") * w).sum(0)
            out[f"total_{pin_memory}"] = total.tolist()
            out[f"pinned_{pin_memory}"] = sorted(pinned)

        t0 = time.perf_counter()
        try:
            for batch in DataLoader(OnDevice(), batch_size=2, num_workers=2, timeout=60):
                pass
        except RuntimeError as e:
            out["message"] = str(e)
        out["seconds"] = time.perf_counter() - t0
    """, mode)
    expected = [2 * sum(float(i * i) for i in range(16))] * 3
    assert out["total_False"] == out["total_True"] == expected
    assert out["pinned_False"] == [False] and out["pinned_True"] == [True]
    assert "Caught RuntimeError in DataLoader worker process" in out["message"]
    assert FORK_ERROR in out["message"] and out["seconds"] < 30


@pytest.mark.slow
def test_the_spawn_start_method_works():
    """What the message says to do: a 'spawn' child starts its own tpu."""
    out = run("""
        import multiprocessing as mp

        def work(q):
            q.put(torch.ones(2, device="tpu").sum().item())

        if __name__ == "__main__":  # (a spawned child imports the script again)
            torch.ones(2, device="tpu").sum().item()
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=work, args=(q,))
            p.start()
            out["value"] = q.get(timeout=240)
            p.join(60)
            out["exitcode"] = p.exitcode
    """, timeout=300)
    assert out["value"] == 2.0
    assert out["exitcode"] == 0
