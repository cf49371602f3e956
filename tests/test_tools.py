"""Tools: BM25 search ranked as computed by hand, argument validation, truncation, timeouts, and
the python sandbox's limits (each escape below is refused or contained, and leaves nothing)."""

from __future__ import annotations

import math
import socket
import time
import uuid
from pathlib import Path

import pytest
from conftest import running_command_lines

from envs.sandbox import SandboxLimits
from envs.tools import AnswerTool, PythonTool, SearchTool, Tool, ToolSettings, truncate

# ---- search ----------------------------------------------------------------------------------

CORPUS = [
    "the cat sat on the mat",  # words (stopwords out): cat sat mat             length 3
    "dogs and cats",  # dogs cats                                              length 2
    "a cat, a cat, a cat everywhere in this long long document",  # cat x3 ... length 7
    "fish swim",  # fish swim                                                  length 2
]


def lucene_bm25(tf: int, df: int, length: int, n=4, average=3.5, k1=1.5, b=0.75) -> float:
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * length / average))


def test_bm25_ranks_as_computed_by_hand():
    """Query "cat dogs". By hand: idf(cat) = ln(1 + 2.5/2.5) = 0.6931 (2 documents),
    idf(dogs) = ln(1 + 3.5/1.5) = 1.2040 (1 document); average length 14/4 = 3.5.
    doc 1: dogs once, length 2: 1.2040 * 1 / (1 + 1.5 * (0.25 + 0.75 * 2/3.5)) = 0.5967
    doc 2: cat 3 times, length 7: 0.6931 * 3 / (3 + 1.5 * (0.25 + 0.75 * 7/3.5)) = 0.3697
    doc 0: cat once, length 3: 0.6931 * 1 / (1 + 1.5 * (0.25 + 0.75 * 3/3.5)) = 0.2963
    doc 3 shares no word: left out. The rare word beats the frequent one; three hits in a long
    document beat one in a short one."""
    search = SearchTool(CORPUS)
    (ranking,) = search.ranking(["cat dogs"], k=4)
    assert [d for d, _ in ranking] == [1, 2, 0]
    expected = [0.5967, 0.3697, 0.2963]
    assert [s for _, s in ranking] == pytest.approx(expected, abs=1e-4)
    assert expected == pytest.approx(
        [lucene_bm25(1, 1, 2), lucene_bm25(3, 2, 7), lucene_bm25(1, 2, 3)], abs=1e-4
    )
    assert search.execute({"query": "cat dogs", "k": 2}) == f"[1] {CORPUS[1]}\n[2] {CORPUS[2]}"


def test_search_without_a_matching_word_says_so():
    assert SearchTool(CORPUS).execute({"query": "zebra"}) == "No document matches the query."


def test_search_batch_keeps_order_and_puts_errors_in_place():
    results = SearchTool(CORPUS).execute_batch(
        [{"query": "fish", "k": 1}, {"q": "cat"}, {"query": "dogs", "k": 1}]
    )
    assert results[0] == f"[1] {CORPUS[3]}"
    assert results[1].startswith("Error: bad arguments for search")
    assert results[2] == f"[1] {CORPUS[1]}"


# ---- validation, truncation, timeouts --------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, says",
    [
        ({}, "'query' is a required property"),
        ({"query": 3}, "3 is not of type 'string'"),
        ({"query": ""}, "should be non-empty"),
        ({"query": "cat", "k": 0}, "(k): 0 is less than the minimum of 1"),
        ({"query": "cat", "top": 2}, "Additional properties are not allowed ('top'"),
        (["cat"], "is not of type 'object'"),
        (None, "is not of type 'object'"),
    ],
)
def test_bad_arguments_become_an_error_observation(arguments, says):
    result = SearchTool(CORPUS).execute(arguments)
    assert result.startswith("Error: bad arguments for search") and says in result


def test_truncation_keeps_head_and_tail_within_the_limit():
    text = "".join(f"{i:04d}" for i in range(1000))  # 4000 characters
    cut = truncate(text, 200)
    assert len(cut) <= 200
    assert cut.startswith("0000000100020003") and cut.endswith("0999")
    assert "characters cut" in cut
    assert truncate("short", 200) == "short"


def test_long_output_is_truncated_and_the_error_at_its_end_kept(tmp_path):
    python = PythonTool(ToolSettings(max_output_chars=300), SandboxLimits(root=str(tmp_path)))
    result = python.execute({"code": "print('x' * 10_000)\n1 / 0"})
    assert len(result) <= 300
    assert result.startswith("xxx") and result.endswith(
        "Error: ZeroDivisionError: division by zero"
    )


class SlowTool(Tool):
    name, description = "slow", "sleeps"
    parameters = {"type": "object"}

    def run(self, arguments):
        time.sleep(arguments.get("sleep", 0))
        if arguments.get("fail"):
            raise RuntimeError("broken index")
        return "done"


def test_an_in_process_call_past_its_timeout_returns_an_error_in_time():
    started = time.perf_counter()
    result = SlowTool(ToolSettings(timeout_s=0.2)).execute({"sleep": 3})
    assert time.perf_counter() - started < 1.0
    assert result == "Error: slow timed out after 0.2 s."


def test_a_failing_tool_becomes_an_error_observation():
    result = SlowTool().execute({"fail": True})
    assert result == "Error: slow failed: RuntimeError: broken index"


def test_spec_is_what_chat_templates_take():
    spec = PythonTool().spec()
    assert spec["type"] == "function" and spec["function"]["name"] == "python"
    assert spec["function"]["parameters"]["required"] == ["code"]


def test_answer_is_recorded():
    answer = AnswerTool()
    assert answer.execute({"text": " Paris "}) == "Final answer recorded: Paris"
    assert answer.execute({}).startswith("Error: bad arguments for answer")
    assert answer.answers == ["Paris"]


# ---- the python sandbox ----------------------------------------------------------------------


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain `text`."""
    return [line for line in running_command_lines() if text in line]


ISOLATION_OF: dict[Path, str] = {}  # the box each test's sandbox_root stands for


@pytest.fixture(params=["namespaces", "audit-hooks"])
def sandbox_root(tmp_path, request):
    """Where the runs' directories go, for each box (`SandboxLimits.isolation`: the limits and
    the audit hooks hold in both); after each test, no process of a run and no directory is
    left."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    ISOLATION_OF[root] = request.param
    yield root
    del ISOLATION_OF[root]
    assert processes_mentioning(str(root)) == []
    assert list(root.iterdir()) == []


def python_tool(root: Path, timeout_s: float = 5.0, **limits) -> PythonTool:
    limits = SandboxLimits(root=str(root), isolation=ISOLATION_OF[root], **limits)
    return PythonTool(ToolSettings(timeout_s=timeout_s), limits)


def test_python_prints(sandbox_root):
    assert python_tool(sandbox_root).execute({"code": "print(2**10)"}) == "1024"


def test_python_error_is_the_tracebacks_last_line(sandbox_root):
    result = python_tool(sandbox_root).execute({"code": "print('a')\n{}['key']"})
    assert result == "a\nError: KeyError: 'key'"


def test_python_infinite_loop_is_killed_at_the_wall_time_limit(sandbox_root):
    python = python_tool(sandbox_root, timeout_s=1.0, cpu_s=60)
    started = time.perf_counter()
    result = python.execute({"code": "while True:\n    pass"})
    # Far below the 60-s CPU limit: the wall-time limit ended it (not a timing target: a busy
    # machine took 5.4 s here once).
    assert time.perf_counter() - started < 30.0
    assert result == "Error: timed out after 1 s (wall-time limit)"
    # The fixture checks that no process is left.


def test_python_cpu_time_limit_kills_a_busy_loop(sandbox_root):
    result = python_tool(sandbox_root, timeout_s=10, cpu_s=1).execute({"code": "while 1: pass"})
    assert result == "Error: killed: CPU-time limit reached"


def test_python_fork_bomb_is_refused(sandbox_root):
    # Bounded (64 processes at most) so that a broken guard cannot take the machine down.
    code = "import os, time\nfor _ in range(6):\n    os.fork()\ntime.sleep(30)"
    started = time.perf_counter()
    result = python_tool(sandbox_root).execute({"code": code})
    assert result == (
        "Error: PermissionError: sandbox: starting processes is not allowed here (os.fork)"
    )
    assert time.perf_counter() - started < 3.0


def test_python_subprocess_is_refused(sandbox_root):
    code = "import subprocess\nprint(subprocess.run(['echo', 'hi']))"
    assert "starting processes is not allowed" in python_tool(sandbox_root).execute({"code": code})


def test_python_memory_hog_gets_a_memory_error(sandbox_root):
    code = "x = bytearray(2 * 1024**3)\nprint('allocated')"
    result = python_tool(sandbox_root, memory_mb=512).execute({"code": code})
    assert result == "Error: MemoryError"


def test_python_network_connect_is_refused(sandbox_root):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket\nsocket.socket().connect(('127.0.0.1', {port}))"
        result = python_tool(sandbox_root).execute({"code": code})
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected
            server.accept()
    assert "network access is not allowed here (socket.connect)" in result


def test_python_write_outside_its_directory_is_refused(sandbox_root):
    outside = Path(f"/tmp/outside-{uuid.uuid4().hex}")
    code = f"open({str(outside)!r}, 'w').write('escaped')"
    try:
        result = python_tool(sandbox_root).execute({"code": code})
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)
    assert "PermissionError: sandbox: writing outside" in result


def test_python_removing_a_file_outside_its_directory_is_refused(sandbox_root, tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    code = f"import os\nos.remove({str(precious)!r})"
    result = python_tool(sandbox_root).execute({"code": code})
    assert "changing files outside" in result and "(os.remove)" in result
    assert precious.read_text() == "keep me"


def test_python_writes_inside_its_own_directory(sandbox_root):
    code = "open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())"
    assert python_tool(sandbox_root).execute({"code": code}) == "kept"
    # The fixture checks that the directory is gone afterwards.


def test_python_batch_keeps_order(sandbox_root):
    calls = [
        {"code": "import time\ntime.sleep(0.5)\nprint('first')"},
        {"code": ""},
        {"code": "print('third')"},
    ]
    results = python_tool(sandbox_root).execute_batch(calls)
    assert results[0] == "first" and results[2] == "third"
    assert results[1].startswith("Error: bad arguments for python")


@pytest.mark.parametrize("isolation", ["namespaces", "audit-hooks"])
def test_the_qa_environments_python_tool_runs_in_the_box_its_setting_names(isolation):
    from envs.qa_env import QAEnv
    from flywheel.settings import QASettings

    env = QAEnv(QASettings(tools=["python"], python_isolation=isolation))
    python = env.tools("test")["python"]
    assert python.limits.isolation == isolation
    expected = "/sandbox" if isolation == "namespaces" else "/tmp"
    assert python.execute({"code": "import os\nprint(os.getcwd())"}).startswith(expected)


def test_the_python_isolation_setting_knows_two_boxes():
    from pydantic import ValidationError

    from flywheel.settings import QASettings

    assert QASettings().python_isolation == "namespaces"
    with pytest.raises(ValidationError, match="'namespaces' or 'audit-hooks'"):
        QASettings(python_isolation="none")


def test_the_modules_a_vllm_stage_imports_leave_llvmlite_unloaded():
    """bm25s loads numba's llvmlite; with llvmlite loaded before it starts, vLLM's CPU worker
    dies in its kernel scan, so the stages that start vLLM must not import bm25s."""
    import subprocess
    import sys

    code = (
        "import sys, agents.rollout, envs.qa_env, tasks.evaluate, tasks.explore, tasks.mcts, "
        "tasks.critique; print(sorted({'llvmlite', 'numba', 'bm25s'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
