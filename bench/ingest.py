"""How fast trainsentry ingests event files, measured against its peers in the same run.

Backfilling a long run is where reading speed shows: a daemon started beside a
job that has logged for a week must catch up before its first alert means
anything. Each reader runs in its own process so that its peak memory
(VmHWM) is its own and no reader warms caches or imports for another.

    python bench/ingest.py            # 1,000,000 points per file (written once, cached)
    python bench/ingest.py --quick    # 100,000 points
    python bench/ingest.py --readers trainsentry,rustboard --repeat 5 --profile

Files are cached under bench/.cache/ (git-ignored): a torch SummaryWriter file
(simple_value scalars) and a TF2-encoded one (tensor scalars from
tensorboard's scalar_pb, written by tensorboard's EventFileWriter).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cache import cached

ROOT = Path(__file__).resolve().parent
READERS = ("trainsentry", "tbparse", "loader", "rustboard")
TAGS = 10


def _value(step: int, tag: int) -> float:
    if step % 9973 == 0 and step:
        return (math.nan, math.inf, -math.inf)[(step // 9973 + tag) % 3]
    return math.exp(-step / 20000) * (1 + tag) + 0.01 * math.sin(step * 0.37 + tag)


def _write_torch(path: Path, steps: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(path), max_queue=100_000, flush_secs=3600)
    names = [f"train/metric_{t}" for t in range(TAGS)]
    for step in range(steps):
        for t, name in enumerate(names):
            writer.add_scalar(name, _value(step, t), step)
    writer.close()


def _write_tf2(path: Path, steps: int) -> None:
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(path), max_queue_size=100_000, flush_secs=3600)
    names = [f"epoch_metric_{t}" for t in range(TAGS)]
    for step in range(steps):
        now = time.time()
        for t, name in enumerate(names):
            summary = scalar_pb(name, _value(step, t))
            writer.add_event(event_pb2.Event(wall_time=now, step=step, summary=summary))
    writer.close()


def dataset(kind: str, points: int) -> Path:
    """The cached directory holding one event file of `points` scalars."""
    writer = _write_torch if kind == "torch" else _write_tf2
    return cached(
        f"{kind}_{points}",
        lambda d: writer(d, points // TAGS),
        f"{points:,} points with the {kind} writer",
    )


def event_file(directory: Path) -> Path:
    return next(p for p in sorted(directory.iterdir()) if "tfevents" in p.name)


# -- readers, each run in a child process -------------------------------------------


def read_trainsentry(directory: Path, kind: str) -> int:
    from trainsentry.sources.tail import READ_CHUNK  # the daemon's slice, so its peak memory
    from trainsentry.sources.tfevents import TfEventsDecoder

    path = event_file(directory)
    decoder = TfEventsDecoder()
    mtime = path.stat().st_mtime
    points = 0
    pending = b""
    with path.open("rb") as f:
        while True:
            chunk = f.read(READ_CHUNK)
            data = pending + chunk if pending else chunk
            decoded = decoder.feed(data, at_eof=not chunk, file_time=mtime)
            points += len(decoded.samples)
            pending = data[decoded.consumed :]
            if not chunk:
                return points


def read_tbparse(directory: Path, kind: str) -> int:
    from tbparse import SummaryReader

    event_type = "scalars" if kind == "torch" else "tensors"
    reader = SummaryReader(str(directory), event_types={event_type})
    return len(reader.scalars if kind == "torch" else reader.tensors)


def read_loader(directory: Path, kind: str) -> int:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    points = 0
    for event in EventFileLoader(str(event_file(directory))).Load():
        # The loader migrates simple_value into tensors (data_compat).
        points += sum(1 for v in event.summary.value if v.HasField("tensor"))
    return points


def read_rustboard(directory: Path, kind: str) -> tuple[int, dict[str, Any]]:
    """Loads with the Rust data server and waits until it serves every step it was written."""
    import grpc
    from tensorboard.data.proto import data_provider_pb2 as pb
    from tensorboard.data.proto import data_provider_pb2_grpc as pb_grpc

    binary = _server_binary()
    assert binary is not None
    port_file = directory.parent / f".{directory.name}.port"
    port_file.unlink(missing_ok=True)
    last_step = _last_step(directory)
    argv = [binary, "--logdir", str(directory), "--port", "0", "--port-file", str(port_file)]
    argv += ["--reload", "once", "--checksum", "--samples-per-plugin", "scalars=all"]
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        while not port_file.exists() or not port_file.read_text().endswith("\n"):
            if server.poll() is not None:
                raise RuntimeError(f"server exited with {server.returncode}")
            time.sleep(0.005)
        address = f"localhost:{port_file.read_text().strip()}"
        channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)])
        stub = pb_grpc.TensorBoardDataProviderStub(channel)
        plugin = pb.PluginFilter(plugin_name="scalars")
        while True:
            listing = stub.ListScalars(
                pb.ListScalarsRequest(experiment_id="x", plugin_filter=plugin)
            )
            tags = [t for run in listing.runs for t in run.tags]
            if len(tags) == TAGS and all(t.metadata.max_step == last_step for t in tags):
                break
            time.sleep(0.01)
        loaded = time.perf_counter()
        request = pb.ReadScalarsRequest(
            experiment_id="x", plugin_filter=plugin, downsample=pb.Downsample(num_points=10**9)
        )
        response = stub.ReadScalars(request)
        points = sum(len(t.data.step) for run in response.runs for t in run.tags)
        status = Path(f"/proc/{server.pid}/status").read_text()
        hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
        ticks = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK")
        channel.close()
        return points, {"loaded_at": loaded, "peak_kb": hwm, "cpu_s": cpu}
    finally:
        server.kill()
        server.wait()
        port_file.unlink(missing_ok=True)


def _server_binary() -> str | None:
    try:
        import tensorboard_data_server
    except ImportError:
        return None
    path: str | None = tensorboard_data_server.server_binary()
    return path


def _last_step(directory: Path) -> int:
    return int(directory.name.rsplit("_", 1)[1]) // TAGS - 1


def _peak_kb() -> int:
    """Peak RSS of this process; ru_maxrss would carry over the parent's across exec."""
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))


# Imported before the clock starts: a daemon pays for imports once, not per file.
IMPORTS = {
    # event_batch (numpy) is imported by the decoder on a backfill's first group
    "trainsentry": ["trainsentry.sources.tfevents", "trainsentry.sources.event_batch"],
    "tbparse": ["tbparse"],
    "loader": ["tensorboard.backend.event_processing.event_file_loader"],
    "rustboard": ["grpc", "tensorboard.data.proto.data_provider_pb2_grpc"],
}


def child(reader: str, directory: Path, kind: str, profile: bool) -> None:
    import importlib

    for module in IMPORTS[reader]:
        importlib.import_module(module)
    baseline = _peak_kb()
    fn = globals()[f"read_{reader}"]
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(fn, directory, kind)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
        return
    start = time.perf_counter()
    cpu0 = time.process_time()
    result = fn(directory, kind)
    seconds = time.perf_counter() - start
    extra: dict[str, Any] = {}
    if isinstance(result, tuple):
        result, extra = result
        seconds = extra.pop("loaded_at") - start
    peak = extra.pop("peak_kb", None) or _peak_kb()
    cpu = extra.pop("cpu_s", time.process_time() - cpu0)
    print(json.dumps({"points": result, "seconds": seconds, "peak_kb": peak, "cpu_s": cpu,
                      "baseline_kb": baseline if reader != "rustboard" else 0}))  # fmt: skip


def run_child(reader: str, directory: Path, kind: str) -> dict[str, Any] | str:
    if reader == "rustboard" and _server_binary() is None:
        return "tensorboard-data-server binary not installed"
    argv = [sys.executable, __file__, "--child", reader, str(directory), kind]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr else done.returncode}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def profile(directory: Path, kind: str) -> None:
    """cProfile of trainsentry's reader, run apart so that its overhead skews no timing."""
    argv = [sys.executable, __file__, "--child", "trainsentry", str(directory), kind, "--profile"]
    print(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 points instead of 1,000,000")
    parser.add_argument("--readers", default=",".join(READERS))
    parser.add_argument("--kinds", default="torch,tf2")
    parser.add_argument("--profile", action="store_true", help="cProfile trainsentry's reader")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="best of N runs per reader (a shared machine is noisy)",
    )
    parser.add_argument(
        "--json", type=Path, help="also write each reader's result to this file (bench/all.py)"
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("READER", "DIR", "KIND"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(ROOT.parent / "daemon"))
        child(args.child[0], Path(args.child[1]), args.child[2], args.profile)
        return
    points = 100_000 if args.quick else 1_000_000
    readers = [r for r in args.readers.split(",") if r]
    print("ratios are trainsentry's speed over the peer's (>1: trainsentry is faster); the")
    print("per-CPU-second rate is the fairer one on a shared machine (load average shown)")
    found: dict[str, dict[str, Any]] = {}
    for kind in args.kinds.split(","):
        directory = dataset(kind, points)
        size = event_file(directory).stat().st_size
        load = os.getloadavg()[0]
        print(f"\n{kind}: {points:,} points, {size / 2**20:.1f} MiB, {TAGS} tags, CRC checked, "
              f"load {load:.1f} on {os.cpu_count()} cores")  # fmt: skip
        print(f"{'reader':<12} {'points/s':>9} {'per cpu-s':>9} {'wall s':>7} {'cpu s':>7} "
              f"{'peak MiB':>8} {'+reading':>8} {'ratio':>6} {'cpu ratio':>9}")  # fmt: skip
        rates: dict[str, tuple[float, float]] = {}
        found[kind] = {"points": points, "load": load, "readers": {}}
        for reader in readers:
            runs = [run_child(reader, directory, kind) for _ in range(max(args.repeat, 1))]
            done = [r for r in runs if not isinstance(r, str)]
            result = min(done, key=lambda r: r["seconds"]) if done else runs[0]
            found[kind]["readers"][reader] = result
            if isinstance(result, str):
                print(f"{reader:<12} skipped: {result}")
                continue
            if result["points"] != points:
                print(f"{reader:<12} read {result['points']:,} points, expected {points:,}")
            rate = result["points"] / result["seconds"]
            per_cpu = result["points"] / max(result["cpu_s"], 1e-9)
            rates[reader] = (rate, per_cpu)
            ours = rates.get("trainsentry", (math.nan, math.nan))
            grown = (result["peak_kb"] - result["baseline_kb"]) / 1024
            print(f"{reader:<12} {rate:>9,.0f} {per_cpu:>9,.0f} {result['seconds']:>7.2f} "
                  f"{result['cpu_s']:>7.2f} {result['peak_kb'] / 1024:>8.1f} {grown:>8.1f} "
                  f"{ours[0] / rate:>5.1f}x {ours[1] / per_cpu:>8.1f}x")  # fmt: skip
        if args.profile:
            profile(directory, kind)
    if args.json:
        args.json.write_text(json.dumps(found))


if __name__ == "__main__":
    main()
