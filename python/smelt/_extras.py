"""The rest of smelt from Python: the profiler, ahead-of-time objects and the command line."""

from __future__ import annotations

import os
import pathlib

from . import _smelt


class profile:
    """Records eager ops, compiled calls and their kernels, like `torch.profiler.profile`:

        with smelt.profile() as prof:
            model(x)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
        prof.export_chrome_trace("trace.json")
    """

    def __init__(self, record_shapes: bool = True, profile_memory: bool = False):
        self._opts = (record_shapes, profile_memory)
        self._session = None

    def __enter__(self) -> "profile":
        self._session = _smelt.ProfileSession(*self._opts)
        return self

    def __exit__(self, *exc) -> None:
        self._session.stop()

    def key_averages(self) -> "KeyAverages":
        return KeyAverages(self._session)

    def export_chrome_trace(self, path: str) -> None:
        self._session.export_chrome_trace(str(path))

    def html(self, title: str = "smelt profile") -> str:
        return self._session.html(title)


class KeyAverages(list):
    """The events grouped by key: a list of dicts (`key`, `kind`, `count`,
    `cpu_time_total` and `self_cpu_time_total` in µs, `bytes`, `flops`) with `.table()`."""

    def __init__(self, session):
        super().__init__(session.key_averages())
        self._session = session

    def table(self, sort_by: str = "self_cpu_time_total", row_limit: int | None = None) -> str:
        return self._session.table(sort_by, row_limit)


def cli(*args: str) -> None:
    """Runs the `smelt` command line in this process: `smelt.cli("check", "m.smelt")`."""
    _smelt.cli([str(a) for a in args])


def compile_aot(model: str, out: str, *, name: str | None = None, weights: str | None = None,
                shared: bool = False, cpu: str = "native", graph: str | None = None) -> None:
    """`smelt compile --target cpu`: writes `out/NAME.o`, `NAME.h` and the manifest for a
    `.smelt` or `.onnx` model (and `libNAME.so` with `shared`)."""
    _find_runtime_library()
    args = ["compile", str(model), "--target", "cpu", "--out", str(out), "--cpu", cpu]
    for flag, value in [("--name", name), ("--weights", weights), ("--graph", graph)]:
        if value is not None:
            args += [flag, str(value)]
    if shared:
        args.append("--shared")
    _smelt.cli(args)


def _find_runtime_library() -> None:
    """Points `SMELT_RT_LIB` at the run-time library a C program links (`libsmelt_rt.a`):
    one beside the package when it ships one; otherwise the variable must name it."""
    if os.environ.get("SMELT_RT_LIB"):
        return
    shipped = pathlib.Path(__file__).with_name("libsmelt_rt.a")
    if shipped.is_file():
        os.environ["SMELT_RT_LIB"] = str(shipped)
        return
    raise OSError(
        "compile_aot needs smelt's run-time library (libsmelt_rt.a): build it with "
        "`cargo build --release -p smelt-rt` in smelt's repository and set SMELT_RT_LIB to "
        "target/release/libsmelt_rt.a")
