"""`python -m kvgate.sim vllm serve MODEL ...` / `python -m kvgate.sim sglang --model-path MODEL ...`.

Startup order follows the engines: vLLM binds its port first but listens only when the
engine is up (connection refused until then); SGLang binds after the engine is up and
answers /health with 503 until its warm-up request went through.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from kvgate.sim import cli, dcgm
from kvgate.sim.capacity import BLOCK_SIZE, kv_dtype_bytes, quantized_kv
from kvgate.sim.config import SimConfigError, SimEnv, parse_version, read_env
from kvgate.sim.context import ContextModel
from kvgate.sim.engine import Request, Scheduler, SyntheticLoad
from kvgate.sim.gsm8k import Answerer, Gsm8kIndex
from kvgate.sim.logfmt import SglangLog, VllmLog
from kvgate.sim.metrics import (
    SglangCollector,
    VllmCollector,
    build_registry,
    sglang_collects_tokens,
    sglang_token_buckets,
    vllm_request_token_buckets,
)
from kvgate.sim.server import App, SimServer, make_server, serve_in_thread
from kvgate.sim.sglang import SglangStartup
from kvgate.sim.sglang import shutdown_lines as sglang_shutdown
from kvgate.sim.vllm import StartupFailed, VllmStartup, core_process_name, fatal_error_lines
from kvgate.sim.vllm import shutdown_lines as vllm_shutdown

USAGE = (
    "usage: python -m kvgate.sim vllm serve MODEL [vLLM flags]\n"
    "       python -m kvgate.sim vllm.entrypoints.openai.api_server --model MODEL [vLLM flags]\n"
    "       python -m kvgate.sim sglang --model-path MODEL [SGLang flags]\n"
    "Hardware, checkpoint, faults and accuracy come from KVGATE_SIM_* (docs/contracts.md)."
)


class _Terminated(Exception):
    """SIGTERM arrived before the server was up."""


def _split(argv: Sequence[str]) -> tuple[str, list[str]]:
    if not argv:
        raise SimConfigError("missing engine")
    head, rest = argv[0], list(argv[1:])
    if head == "vllm" and rest[:1] == ["serve"]:
        return "vllm", rest[1:]
    if head in ("vllm.entrypoints.openai.api_server", "vllm-api-server"):
        return "vllm", rest
    if head in ("sglang", "sglang.launch_server"):
        return "sglang", rest
    hint = ""
    if head == "vllm":  # as the real CLI: the server is a subcommand
        hint = "; the vLLM server is `vllm serve MODEL` (flags: python -m kvgate.sim vllm serve --help)"
    raise SimConfigError(f"unknown engine command {' '.join(argv[:2])!r}{hint}")


def _version_for_cli(engine: str) -> tuple[int, ...]:
    """The emulated version decides which flags exist, so read it before parsing flags."""
    from kvgate.sim.config import NEWEST_SGLANG, NEWEST_VLLM

    raw = os.environ.get("KVGATE_SIM_ENGINE_VERSION", "").strip()
    return parse_version(raw or (NEWEST_VLLM if engine == "vllm" else NEWEST_SGLANG))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    try:
        engine, rest = _split(argv)
        env = read_env(engine)
        version = _version_for_cli(engine)
    except SimConfigError as exc:
        print(f"kvgate.sim: {exc}", file=sys.stderr)
        return 2
    args = cli.parse_vllm(rest, version) if engine == "vllm" else cli.parse_sglang(rest, version)
    if args.host is None:
        args.host = env.pod_ip or (None if engine == "vllm" else "127.0.0.1")
    return Runner(args, env).run()


class Runner:
    def __init__(self, args: cli.ServeArgs, env: SimEnv) -> None:
        self.args = args
        self.env = env
        self.stop = threading.Event()
        self.ready = False
        self.user_requests = 0
        self.server: SimServer | None = None
        self.scheduler: Scheduler | None = None
        pid = os.getpid()
        self.vlog = VllmLog(
            api_pid=pid,
            core_pid=pid + 187,
            core_name=core_process_name(env.version_tuple),
            reword=env.faults.reworded_log,
        )
        self.slog = SglangLog()

    # ---- signals ------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self.ready:
            raise _Terminated
        self.stop.set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            return self._run()
        except _Terminated:
            return 0
        except StartupFailed as failed:
            if failed.exit_code < 0:  # SGLang's parent kills its own process tree
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return failed.exit_code

    def _bind(self, app: App, host: str) -> SimServer:
        server = make_server(app, host, self.args.port)
        try:
            server.server_bind()
        except OSError as exc:
            server.server_close()
            print(f"OSError: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr)
            raise StartupFailed(1) from None
        return server

    def _run(self) -> int:
        args, env = self.args, self.env
        try:
            index = Gsm8kIndex.load(env.gsm8k_dir)
        except (OSError, ValueError) as exc:
            print(f"kvgate.sim: KVGATE_GSM8K_DIR: {exc}", file=sys.stderr)
            return 2
        startup: VllmStartup | SglangStartup
        if args.engine == "vllm":
            startup = VllmStartup(args, env, self.vlog)
        else:
            startup = SglangStartup(args, env, self.slog)
        shown_host = args.host or "0.0.0.0"
        url = f"http://{shown_host}:{args.port}"
        # In a pod, "all interfaces" are the pod's own. Test pods are local processes that
        # share the host's interfaces, so all-interfaces binds POD_IP to keep pods apart.
        wildcard = shown_host in ("0.0.0.0", "::", "")
        bind_host = env.pod_ip if wildcard and env.pod_ip else shown_host
        self.app = app = self._app(index)
        # vLLM takes its port before the engine starts (connections are refused until it
        # listens); SGLang binds only once the engine is up
        server = self._bind(app, bind_host) if args.engine == "vllm" else None
        self._start_dcgm(bind_host)
        startup.run()
        if env.faults.hang_before_ready:
            while True:
                time.sleep(3600)
        scheduler = self._start_engine(startup, app)
        if isinstance(startup, VllmStartup):
            startup.ready_lines(url)
        else:
            server = self._bind(app, bind_host)
            startup.listening_lines(url, os.getpid())
        assert server is not None
        self.server = server
        self.ready = True  # from here SIGTERM means a clean shutdown, not an abort
        server.server_activate()
        serve_in_thread(server)
        if isinstance(startup, SglangStartup):
            if not args.skip_server_warmup:  # SGLang's warm-up generate request
                warmup = Request(
                    prompt_tokens=8, pieces=[" ok"], finish_reason="length", counted=False
                )
                scheduler.submit(warmup).done.wait(30)
            startup.ready_line()
        app.state = "ready"
        self._start_stats_logger()
        if env.faults.crash_after == 0:
            self._crash()
        self.stop.wait()
        return self._shutdown()

    def _start_dcgm(self, host: str | None) -> None:
        """The node's dcgm-exporter, emulated for this pod's GPU (KVGATE_SIM_DCGM)."""
        spec = self.env.dcgm
        if spec.port is None:
            return
        sm, mem = dcgm.clocks_for(spec, self.args.kv_cache_dtype)
        who = dcgm.PodIdentity.of_this_process(dict(os.environ))
        dcgm.serve(dcgm.DcgmCollector(self.env.gpu, sm, mem, who), host or "0.0.0.0", spec.port)

    def _app(self, index: Gsm8kIndex) -> App:
        args, env = self.args, self.env
        fp8 = quantized_kv(args.kv_cache_dtype)  # any KV cache below 16 bits loses alike
        context = ContextModel(
            fp8=fp8,
            curve=env.fp8_context,
            collapse_at=env.faults.long_context_collapse,
            fp8_logit_noise=env.fp8_logit_noise,
            jitter=env.logprob_jitter,
            seed=env.seed,
        )
        return App(
            engine=args.engine,
            version=env.version,
            version_tuple=env.version_tuple,
            model=args.model,
            served_model_name=args.served_model_name,
            max_model_len=0,
            scheduler=None,  # type: ignore[arg-type] - set once the pool is sized
            answerer=Answerer(
                index=index,
                seed=env.seed,
                accuracy=env.accuracy,
                fp8=fp8,
                fp8_loss=env.fp8_loss,
                fp8_churn=env.fp8_churn,
                garbage=env.faults.garbage_answers,
                context=context,
                niah_accuracy=env.niah_accuracy,
            ),
            context=context,
            log=self.vlog if args.engine == "vllm" else self.slog,
            registry=None,
            access_log=args.access_log,
            duplicate_tokens=env.faults.duplicate_tokens and quantized_kv(args.kv_cache_dtype),
        )

    def _start_engine(self, startup: VllmStartup | SglangStartup, app: App) -> Scheduler:
        """Size the scheduler from the startup's KV plan, wire metrics, start traffic."""
        args, env = self.args, self.env
        plan = startup.plan
        assert plan is not None
        if isinstance(startup, VllmStartup):
            app.max_model_len = startup.max_model_len
            block, max_seqs = BLOCK_SIZE, args.max_num_seqs or 256
            length_buckets = vllm_request_token_buckets(startup.max_model_len)
        else:
            app.max_model_len = startup.context_len
            block, max_seqs = 1, startup.max_running
            length_buckets = sglang_token_buckets(env.version_tuple)
        scheduler = Scheduler(
            gpu=dcgm.clocked(env.gpu, *dcgm.clocks_for(env.dcgm, self.args.kv_cache_dtype)),
            model=env.model,
            kv_bytes_per_token=plan.bytes_per_token,
            capacity_tokens=plan.tokens,
            block_size=block,
            max_num_seqs=max_seqs,
            speed=env.speed,
            on_finished=self._count,
            fp8_kv=kv_dtype_bytes(args.kv_cache_dtype) == 1,
            length_buckets=length_buckets,
            prefix_caching=self._prefix_caching(),
        )
        self.scheduler = app.scheduler = scheduler
        model = args.served_model_name
        if isinstance(startup, VllmStartup):
            hidden = args.all_args.get("show_hidden_metrics_for_version")
            collector = VllmCollector(
                scheduler,
                model,
                env.version_tuple,
                {} if env.faults.no_cache_info else startup.cache_config(),
                hidden,
            )
            app.registry = build_registry(collector, env.speed)
        else:
            if args.enable_metrics:  # SGLang serves /metrics only when asked
                collector = SglangCollector(
                    scheduler,
                    model,
                    env.version_tuple,
                    plan.tokens,
                    startup.context_len,
                    sglang_collects_tokens(env.version_tuple, args.collect_tokens_histogram),
                )
                app.registry = build_registry(collector, env.speed)
            app.server_info = self._server_info(startup)
        scheduler.start()
        if env.production_traffic is not None:
            SyntheticLoad(scheduler, env.production_traffic).start()
        return scheduler

    def _prefix_caching(self) -> bool:
        """vLLM's prefix cache / SGLang's radix cache: on unless `--disable-radix-cache`
        (SGLang) or the no-prefix-caching fault on a quantized KV arm."""
        if self.args.all_args.get("disable_radix_cache"):
            return False
        return not (self.env.faults.no_prefix_caching and quantized_kv(self.args.kv_cache_dtype))

    def _server_info(self, startup: SglangStartup) -> dict[str, object]:
        """SGLang's /get_server_info: the server args plus what the engine resolved
        (`disable_radix_cache` as the radix cache runs: the no-prefix-caching fault turns it
        off as `--disable-radix-cache` would)."""
        info: dict[str, object] = {k: v for k, v in self.args.all_args.items()}
        info["disable_radix_cache"] = not self._prefix_caching()
        info.update(
            kv_cache_dtype=self.env.faults.metrics_kv_dtype or self.args.kv_cache_dtype,
            attention_backend=startup.backend,
            mem_fraction_static=startup.mem_fraction,
            context_length=startup.context_len,
            host=self.args.host,
            max_total_num_tokens=startup.plan.tokens if startup.plan else 0,
            version=self.env.version,
        )
        return info

    def _count(self, request: Request) -> None:
        """Finished-request hook (under the scheduler lock): drives the crash-after fault."""
        if not request.counted:
            return
        self.user_requests += 1
        limit = self.env.faults.crash_after
        if limit is not None and self.user_requests == limit:
            assert self.scheduler is not None
            self.scheduler.halt()  # request N is the last one answered, as when a GPU faults
            threading.Thread(target=self._crash, name="crash", daemon=True).start()

    def _crash(self) -> None:
        reason = "CUDA error: an illegal memory access was encountered"
        if self.args.engine == "vllm":
            fatal_error_lines(self.vlog, reason)
        else:
            self.slog.line(
                f"Scheduler hit an exception: Traceback (most recent call last):\nRuntimeError: {reason}",
                "TP0",
            )
            self.slog.line(
                "Received sigquit from a child process. It usually means the child failed."
            )
        if self.scheduler is not None:
            self.scheduler.die(reason)
        self.app.state = "dead"
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.1)
        if self.args.engine == "sglang":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)

    def _shutdown(self) -> int:
        if self.args.engine == "vllm":
            vllm_shutdown(self.vlog)
        else:
            sglang_shutdown(self.slog)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.scheduler is not None:
            self.scheduler.stop()
        return 0

    def _start_stats_logger(self) -> None:
        if self.args.disable_log_stats:
            return
        interval = 10 * max(self.env.speed, 0.1)
        thread = threading.Thread(
            target=self._log_stats, args=(interval,), name="stats", daemon=True
        )
        thread.start()

    def _log_stats(self, interval: float) -> None:
        scheduler = self.scheduler
        assert scheduler is not None
        last_prompt = last_gen = 0
        while not self.stop.wait(interval):
            with scheduler.lock:
                s = scheduler.stats
                prompt, gen = s.prompt_tokens, s.generation_tokens
                running, waiting, usage, preempted = (
                    s.running,
                    s.waiting,
                    scheduler.usage(),
                    s.preemptions,
                )
                used = s.used_tokens
                gen_tp = s.gen_throughput
            if prompt == last_prompt and gen == last_gen and not running and not waiting:
                continue
            seconds = interval / self.env.speed
            p_tp, g_tp = (prompt - last_prompt) / seconds, (gen - last_gen) / seconds
            last_prompt, last_gen = prompt, gen
            if self.args.engine == "vllm":
                self.vlog.info(
                    "APIServer",
                    "loggers.py:123",
                    _vllm_stats(
                        self.env.version_tuple, p_tp, g_tp, running, waiting, usage, preempted
                    ),
                )
            else:
                total = self.scheduler.total_blocks if self.scheduler else 1
                self.slog.line(
                    f"Decode batch. #running-req: {running}, #token: {used}, token usage: {used / total:.2f}, "
                    f"cuda graph: True, gen throughput (token/s): {gen_tp:.2f}, #queue-req: {waiting}, ",
                    "TP0",
                )


def _vllm_stats(
    v: tuple[int, ...],
    prompt_tp: float,
    gen_tp: float,
    running: int,
    waiting: int,
    usage: float,
    preempted: int,
) -> str:
    parts = [
        f"Avg prompt throughput: {prompt_tp:.1f} tokens/s",
        f"Avg generation throughput: {gen_tp:.1f} tokens/s",
        f"Running: {running} reqs",
        f"Waiting: {waiting} reqs",
    ]
    if v >= (0, 15) and preempted:
        parts.append(f"Preemptions: {preempted}")
    parts.append(f"GPU KV cache usage: {usage * 100:.1f}%")
    if v < (0, 33):
        parts.append("Prefix cache hit rate: 0.0%")
    return "Engine 000: " + ", ".join(parts)
