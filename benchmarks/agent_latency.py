"""What long-term memory costs a LangChain agent's turn: background, deferred and eager summaries.

A scripted conversation of ``--turns`` user messages goes through a real
``create_agent`` agent, once without memory and once per aggregation mode of
``MemTreeMemoryMiddleware`` (``background``, the default; ``deferred`` to the end of
the session; ``eager``, inside the turn), side by side in one run.

Both the agent's chat model and the memory's are the OpenAI-compatible test server
(tests/openai_server.py), run in a separate process and reached over HTTP with the
real ``openai`` client, each on its own server so their requests are counted apart; every chat request is answered
after ``--delay`` seconds (300 ms by default). The memory embeds through the memory
server's embeddings endpoint (answered at once) and keeps its tree in a SQLite file.

Measured per mode:

* turn latency: wall time of ``agent.invoke`` for one user message (mean, median, p95),
  and its ratio to the run without memory (target <= 1.10);
* chat requests per turn *on the turn's path*: the agent's requests plus the memory's
  requests made inside the middleware's recording hook (a request counts when it
  started and ended inside the hook, i.e. the turn waited for it); ratio to the
  run without memory (target <= 1.05);
* the memory's chat requests outside turns (the background worker, the flush at
  the session's end): what summaries still cost, off the hot path;
* summary lag: after each turn, for every exchange recorded so far, whether every
  summary above it has been written since; the lag is how many turns passed until
  then (the session's end counts as one turn after the last);
* the session's end: how long ``memory.close()`` takes (the flush of what is pending).

Writes ``agent_latency.md``, ``agent_latency.json`` and ``agent_latency.png`` to ``--out``.

    python benchmarks/agent_latency.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test server

from langchain.agents import create_agent  # noqa: E402
from langchain_core.callbacks import CallbackManagerForLLMRun  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from langchain_memtree import MemTreeMemoryMiddleware  # noqa: E402
from memtree import ROOT_ID, MemTree, MemTreeConfig  # noqa: E402
from memtree.models import OpenAIChatModel, OpenAIEmbedder  # noqa: E402
from memtree.retry import RetryPolicy  # noqa: E402

MODES = ("background", "deferred", "eager")
LATENCY_TARGET = 1.10
REQUEST_TARGET = 1.05

TOPICS = [
    (
        "my greyhound Pepper",
        [
            "is scared of bicycles",
            "loves the beach at dawn",
            "sleeps on the sofa all day",
            "learned to sit for treats",
            "had a vet check-up on Monday",
        ],
    ),
    (
        "my sourdough bread",
        [
            "came out flat again",
            "needs a warmer kitchen",
            "rose well with rye flour",
            "tastes better after two days",
            "won a prize at the village fair",
        ],
    ),
    (
        "my half marathon training",
        [
            "hurt my left knee on hills",
            "reached 18 km on Sunday",
            "follows a plan from my coach",
            "includes intervals on Thursdays",
            "ends with the Lisbon race in October",
        ],
    ),
    (
        "my trip to Kyoto",
        [
            "starts on the 3rd of May",
            "includes a pottery workshop",
            "has a ramen tour booked",
            "needs a rail pass",
            "ends with two days in Tokyo",
        ],
    ),
    (
        "my sister Rosa",
        [
            "moved to Porto last year",
            "is a nurse on night shifts",
            "plays the cello",
            "has a birthday in June",
            "is visiting me next week",
        ],
    ),
    (
        "my garden",
        [
            "has tomatoes ripening early",
            "needs a new hose",
            "attracts many bees",
            "was flooded in April",
            "has a lemon tree from my grandmother",
        ],
    ),
    (
        "my new job",
        [
            "starts at 8 every morning",
            "is in a robotics lab",
            "has a long commute by train",
            "gave me a laptop on day one",
            "has a team lunch on Fridays",
        ],
    ),
    (
        "my cello lessons",
        [
            "are on Wednesday evenings",
            "moved to a new teacher",
            "focus on Bach suites",
            "need a new bow",
            "end with a recital in December",
        ],
    ),
    (
        "my flat",
        [
            "has a leaking kitchen tap",
            "gets morning sun",
            "is close to the river",
            "needs new curtains",
            "has a noisy neighbour upstairs",
        ],
    ),
    (
        "my book club",
        [
            "is reading a Japanese novel",
            "meets on the first Tuesday",
            "has eight members",
            "picked a mystery for June",
            "moved online for the summer",
        ],
    ),
]


def script(turns: int) -> list[str]:
    """``turns`` user messages that come back to the same topics, as real chats do."""
    messages = []
    for i in range(turns):
        subject, facts = TOPICS[i % len(TOPICS)]
        fact = facts[(i // len(TOPICS)) % len(facts)]
        messages.append(f"Remember that {subject} {fact}. What do you think?")
    return messages


class ServerChatModel(BaseChatModel):
    """A LangChain chat model served by the OpenAI-compatible test server (real HTTP)."""

    base_url: str
    api_key: str

    @property
    def _llm_type(self) -> str:
        return "openai-test-server"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        import openai

        client = _client(self.base_url, self.api_key)
        roles = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}
        payload = [{"role": roles.get(m.type, "user"), "content": m.text} for m in messages]
        response = client.chat.completions.create(model="agent-model", messages=payload)
        assert isinstance(client, openai.OpenAI)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(response.choices[0].message.content or ""))])


_CLIENTS: dict[str, Any] = {}


def _client(base_url: str, api_key: str) -> Any:
    import openai

    if base_url not in _CLIENTS:
        _CLIENTS[base_url] = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    return _CLIENTS[base_url]


SERVERS = """
import sys
from openai_server import FakeOpenAIServer

delay = float(sys.argv[1])
with FakeOpenAIServer(chat_delay=delay) as agent, FakeOpenAIServer(chat_delay=delay) as memory:
    print(agent.url, memory.url, agent.api_key, flush=True)
    for line in sys.stdin:  # "count": chat requests so far; end of input: stop
        print(agent.count("chat"), memory.count("chat"), flush=True)
"""


class Servers:
    """The agent's and the memory's test servers, in their own process: their work
    (HTTP, hashing embeddings) then competes with the agent for CPU as a remote API
    would, not for this process's interpreter lock."""

    def __init__(self, delay: float) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
        self._process = subprocess.Popen(
            [sys.executable, "-c", SERVERS, str(delay)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._process.stdout is not None
        self.agent_url, self.memory_url, self.api_key = self._process.stdout.readline().split()

    def counts(self) -> tuple[int, int]:
        """Chat requests the agent's and the memory's server have received."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write("count\n")
        self._process.stdin.flush()
        agent, memory = self._process.stdout.readline().split()
        return int(agent), int(memory)

    def memory_options(self) -> dict[str, str]:
        return {"base_url": self.memory_url, "api_key": self.api_key}

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=30)


class TimedChatModel(OpenAIChatModel):
    """The memory's chat model, noting when each request started and ended."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.windows: list[tuple[float, float]] = []

    def complete(self, prompt: str) -> Any:
        start = time.perf_counter()
        try:
            return super().complete(prompt)
        finally:
            self.windows.append((start, time.perf_counter()))


class TimedMiddleware(MemTreeMemoryMiddleware):
    """The middleware, noting when each recording hook started and ended, and
    calling ``before_record`` (outside the timed window) just before recording."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.windows: list[tuple[float, float]] = []
        self.before_record: Any = None

    def after_model(self, state: Any, runtime: Any) -> Any:
        if self.before_record is not None:
            self.before_record()
        start = time.perf_counter()
        try:
            return super().after_model(state, runtime)
        finally:
            self.windows.append((start, time.perf_counter()))


def written_leaves(memory: MemTree) -> set[str]:
    """Leaves every summary above which is up to date (not stale)."""
    nodes = {node.id: node for node in memory.walk()}
    done = set()
    for node in nodes.values():
        if not node.is_leaf or node.id == ROOT_ID:
            continue
        parent = node.parent
        while parent is not None and parent != ROOT_ID and not nodes[parent].stale:
            parent = nodes[parent].parent
        if parent is None or parent == ROOT_ID:
            done.add(node.id)
    return done


def run_mode(mode: str | None, messages: Sequence[str], delay: float, workdir: Path) -> dict[str, Any]:
    """One session: ``mode`` None is the agent without memory."""
    retry = RetryPolicy(timeout=60.0)
    servers = Servers(delay)
    try:
        model = ServerChatModel(base_url=servers.agent_url, api_key=servers.api_key)
        memory: MemTree | None = None
        middleware: TimedMiddleware | None = None
        llm: TimedChatModel | None = None
        if mode is not None:
            llm = TimedChatModel(**servers.memory_options(), retry=retry)
            memory = MemTree.open(
                workdir / f"{mode}.db",
                embedder=OpenAIEmbedder(**servers.memory_options(), retry=retry),
                llm=llm,
                config=MemTreeConfig(theta0=0.3),
            )
            # one user, so one fixed namespace: the memory's own
            middleware = TimedMiddleware(memory=memory, namespace=memory.namespace, aggregation=mode)  # type: ignore[arg-type]
        agent = create_agent(
            model,
            tools=[],
            system_prompt="You are a friendly assistant.",
            middleware=[middleware] if middleware is not None else [],
            checkpointer=InMemorySaver(),
        )
        config = {"configurable": {"thread_id": "session"}}
        agent.invoke({"messages": [HumanMessage("Hello!")]}, config={"configurable": {"thread_id": "warm-up"}})
        if memory is not None:
            memory.wait_for_summaries()
        memory_before = servers.counts()[1]
        if llm is not None:
            llm.windows.clear()
        if middleware is not None:
            middleware.windows.clear()
        latencies, agent_requests = [], []
        warm_up_leaves = {leaf.id for leaf in memory.leaves()} if memory is not None else set()
        inserted_at: dict[str, tuple[int, float]] = {}
        written_at: dict[str, tuple[int, float]] = {}
        turn = 0
        looking = [0.0]  # seconds spent looking inside the current turn (not the turn's cost)

        def look(label: int) -> None:
            """Note the leaves whose summaries are all written, as of turn ``label``."""
            assert memory is not None
            now = time.perf_counter()
            for leaf_id in written_leaves(memory) - written_at.keys():
                if leaf_id in inserted_at:
                    written_at[leaf_id] = (label, now)
            looking[0] += time.perf_counter() - now

        if middleware is not None:
            # Just before a turn records (after its model call): the summaries of the
            # exchanges before it had that turn's time to be written. Looking only at
            # turn ends would always find the newest exchange's path stale.
            middleware.before_record = lambda: look(turn)
        for turn, message in enumerate(messages):
            before = servers.counts()[0]
            looking[0] = 0.0
            start = time.perf_counter()
            agent.invoke({"messages": [HumanMessage(message)]}, config=config)
            latencies.append(time.perf_counter() - start - looking[0])
            agent_requests.append(servers.counts()[0] - before)
            if memory is not None:
                for leaf in memory.leaves():
                    if leaf.id not in warm_up_leaves:
                        inserted_at.setdefault(leaf.id, (turn, time.perf_counter()))
                look(turn)
        session_end = 0.0
        end_requests = 0
        if memory is not None:
            assert llm is not None and middleware is not None
            before_end = servers.counts()[1]
            start = time.perf_counter()
            memory.close()  # the session's end: what is still pending is written now
            session_end = time.perf_counter() - start
            end_requests = servers.counts()[1] - before_end
            reopened = MemTree.open(workdir / f"{mode}.db", embedder=OpenAIEmbedder(**servers.memory_options()))
            for leaf_id in written_leaves(reopened) - written_at.keys():
                written_at[leaf_id] = (len(messages), time.perf_counter())
            stale_after_close = reopened.stats().stale
            leaves_after_close = len(reopened) - len(warm_up_leaves)
            reopened.close()
        turns = len(messages)
        result: dict[str, Any] = {
            "mode": mode or "no memory",
            "turns": turns,
            "latencies_s": latencies,
            "latency_mean_s": statistics.fmean(latencies),
            "latency_median_s": statistics.median(latencies),
            "latency_p95_s": sorted(latencies)[max(0, round(0.95 * turns) - 1)],
            "agent_requests_per_turn": sum(agent_requests) / turns,
        }
        if memory is None:
            result["turn_requests_per_turn"] = result["agent_requests_per_turn"]
            return result
        assert llm is not None and middleware is not None
        in_turn = sum(1 for start, end in llm.windows if any(a <= start and end <= b for a, b in middleware.windows))
        memory_total = servers.counts()[1] - memory_before
        lags = [written_at[leaf][0] - turn for leaf, (turn, _) in inserted_at.items() if leaf in written_at]
        lag_seconds = [written_at[leaf][1] - when for leaf, (_, when) in inserted_at.items() if leaf in written_at]
        result.update(
            {
                "memory_requests_in_turns": in_turn,
                "memory_requests_outside_turns": memory_total - in_turn,
                "memory_requests_at_session_end": end_requests,
                "turn_requests_per_turn": (sum(agent_requests) + in_turn) / turns,
                "memory_requests_per_turn_outside": (memory_total - in_turn) / turns,
                "summary_lag_turns": lags,
                "summary_lag_mean": statistics.fmean(lags) if lags else None,
                "summary_lag_max": max(lags) if lags else None,
                "summary_lag_seconds_median": statistics.median(lag_seconds) if lag_seconds else None,
                "summaries_never_written": len(inserted_at) - len(lags),
                "session_end_s": session_end,
                "stale_after_close": stale_after_close,
                "leaves_after_close": leaves_after_close,
            }
        )
        return result
    finally:
        servers.close()


def combined(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's sessions as one row: turns pooled, counts added, per-turn rates averaged."""
    first = sessions[0]
    latencies = [latency for session in sessions for latency in session["latencies_s"]]
    out: dict[str, Any] = {
        "mode": first["mode"],
        "sessions": len(sessions),
        "turns": first["turns"],
        "latencies_s": latencies,
        "latency_mean_s": statistics.fmean(latencies),
        "latency_median_s": statistics.median(latencies),
        "latency_p95_s": sorted(latencies)[max(0, round(0.95 * len(latencies)) - 1)],
        "session_latency_means_s": [session["latency_mean_s"] for session in sessions],
        "latency_by_turn_s": [
            statistics.fmean(session["latencies_s"][turn] for session in sessions) for turn in range(first["turns"])
        ],
    }
    for key in (
        "agent_requests_per_turn",
        "turn_requests_per_turn",
        "memory_requests_per_turn_outside",
        "session_end_s",
    ):
        if key in first:
            out[key] = statistics.fmean(session[key] for session in sessions)
    for key in ("memory_requests_in_turns", "memory_requests_outside_turns", "memory_requests_at_session_end"):
        if key in first:
            out[key] = sum(session[key] for session in sessions)
    if "summary_lag_turns" in first:
        lags = [lag for session in sessions for lag in session["summary_lag_turns"]]
        out["summary_lag_turns"] = lags
        out["summary_lag_mean"] = statistics.fmean(lags) if lags else None
        out["summary_lag_max"] = max(lags) if lags else None
        seconds = [s["summary_lag_seconds_median"] for s in sessions if s["summary_lag_seconds_median"] is not None]
        out["summary_lag_seconds_median"] = statistics.median(seconds) if seconds else None
        out["summaries_never_written"] = sum(session["summaries_never_written"] for session in sessions)
        out["stale_after_close"] = max(session["stale_after_close"] for session in sessions)
        out["leaves_after_close"] = min(session["leaves_after_close"] for session in sessions)
    return out


def report(out: Path, args: argparse.Namespace, command: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    base = runs[0]
    for run in runs:
        run["latency_ratio"] = run["latency_mean_s"] / base["latency_mean_s"]
        run["request_ratio"] = run["turn_requests_per_turn"] / base["turn_requests_per_turn"]
    machine = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    results = {
        "command": command,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": machine,
        "settings": {
            "turns": args.turns,
            "sessions_per_mode": args.rounds,
            "delay_s": args.delay,
            "store": "sqlite",
            "embeddings": "test server (answered at once)",
        },
        "targets": {"latency_ratio": LATENCY_TARGET, "request_ratio": REQUEST_TARGET},
        "runs": runs,
    }
    (out / "agent_latency.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# Agent turn latency with memtree's middleware",
        "",
        f"{args.turns}-turn scripted conversation through `create_agent`, {args.rounds} sessions per mode in "
        "alternating order (rows pool their turns); agent and memory chat models on the "
        f"OpenAI-compatible test server, {args.delay * 1000:.0f} ms per chat request; the memory embeds through the "
        "server (answered at once) and keeps its tree in SQLite. Produced by `benchmarks/agent_latency.py`.",
        "",
        f"- Command: `{command}`",
        f"- Machine: {machine['platform']}, Python {machine['python']}, {machine['cpus']} CPUs "
        f"(shared with other jobs while it ran); commit {results['commit']}; {results['date']}",
        "",
        "| mode | turn latency mean / median / p95 (s) | latency ÷ no memory | chat requests per turn "
        "(on the turn's path) | requests ÷ no memory | memory chat requests per turn, outside turns | "
        "summary lag in turns (mean / max; median s) | session end: close() per session (s, requests) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        latency = f"{run['latency_mean_s']:.3f} / {run['latency_median_s']:.3f} / {run['latency_p95_s']:.3f}"
        if run["mode"] == "no memory":
            lines.append(f"| no memory | {latency} | 1.00 | {run['turn_requests_per_turn']:.2f} | 1.00 | – | – | – |")
            continue
        lag = (
            f"{run['summary_lag_mean']:.1f} / {run['summary_lag_max']}; {run['summary_lag_seconds_median']:.2f} s"
            if run["summary_lag_mean"] is not None
            else "–"
        )
        lines.append(
            f"| {run['mode']} | {latency} | {run['latency_ratio']:.2f} | {run['turn_requests_per_turn']:.2f} | "
            f"{run['request_ratio']:.2f} | {run['memory_requests_per_turn_outside']:.2f} | {lag} | "
            f"{run['session_end_s']:.2f}, {run['memory_requests_at_session_end'] / run['sessions']:.0f} |"
        )
    lines += [
        "",
        f"Targets: latency ÷ no memory <= {LATENCY_TARGET:.2f}, chat requests per turn ÷ no memory <= "
        f"{REQUEST_TARGET:.2f}. A memory request is on the turn's path when it ran inside the middleware's "
        "recording hook (the turn waited for it). Requests outside turns are the background worker's and the "
        "session-end flush's: summaries still cost them, off the hot path. The lag counts, for each exchange, "
        "the turns until every summary above it was written (the session's end counts as one more turn). "
        "After close(), every mode left "
        + ", ".join(f"{run['stale_after_close']} stale summaries ({run['mode']})" for run in runs[1:])
        + " and all "
        + ", ".join(str(run["leaves_after_close"]) for run in runs[1:])
        + " exchanges stored.",
        "",
    ]
    (out / "agent_latency.md").write_text("\n".join(lines), encoding="utf-8")
    return results


def plot(out: Path, delay: float, runs: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {"no memory": "#444", "background": "#2a7", "deferred": "#37c", "eager": "#d54"}
    for run in runs:
        left.plot(
            range(1, run["turns"] + 1), run["latency_by_turn_s"], label=run["mode"], color=colors[run["mode"]], lw=1.2
        )
    left.axhline(
        runs[0]["latency_mean_s"] * LATENCY_TARGET, color="#999", ls="--", lw=0.8, label="target (1.10 × no memory)"
    )
    left.set_xlabel("turn")
    left.set_ylabel(f"turn latency (s), mean of {runs[0]['sessions']} sessions")
    left.set_title(f"Turn latency, {delay * 1000:.0f} ms per chat request")
    left.legend(fontsize=8)
    names = [run["mode"] for run in runs]
    on_path = [run["turn_requests_per_turn"] for run in runs]
    outside = [run.get("memory_requests_per_turn_outside", 0.0) for run in runs]
    bars = right.bar(names, on_path, color=[colors[name] for name in names], label="on the turn's path")
    right.bar(names, outside, bottom=on_path, color="#ccc", label="memory, outside turns")
    right.bar_label(bars, fmt="%.2f", label_type="center", color="white")
    right.set_ylabel("chat requests per turn")
    right.set_title("Chat requests per turn")
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "agent_latency.png", dpi=120)


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=50, help="user messages in the session")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds before each chat reply")
    parser.add_argument("--rounds", type=int, default=2, help="sessions per mode, in alternating order")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/agent_latency.py " + " ".join(sys.argv[1:])
    messages = script(args.turns)
    sessions: dict[str, list[dict[str, Any]]] = {}
    order: list[str | None] = [None, *MODES]
    for round_number in range(args.rounds):
        # Alternate the order so that no mode always runs first (or while the machine is busiest).
        for mode in order if round_number % 2 == 0 else order[::-1]:
            with tempfile.TemporaryDirectory() as workdir:
                run = run_mode(mode, messages, args.delay, Path(workdir))
            sessions.setdefault(run["mode"], []).append(run)
            print(
                f"round {round_number + 1}, {run['mode']}: mean turn {run['latency_mean_s']:.3f} s, "
                f"{run['turn_requests_per_turn']:.2f} requests per turn",
                flush=True,
            )
    runs = [combined(sessions[name]) for name in ("no memory", *MODES)]
    report(args.out, args, command, runs)
    plot(args.out, args.delay, runs)


if __name__ == "__main__":
    main()
