"""Request traces: the three formats read into the same requests, the shipped Azure traces, the
slice a sweep replays, and every bad trace as one line with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbench.traces import TraceError, load_trace, replay

FIXTURES = Path(__file__).parent / "fixtures" / "traces"


def test_the_three_formats_read_into_arrivals_and_lengths():
    mooncake = load_trace(str(FIXTURES / "mooncake.jsonl"))
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in mooncake.requests] == [
        (0.0, 120, 8), (0.9, 200, 10), (1.5, 300, 6), (2.6, 90, 12)]  # milliseconds, sorted
    assert mooncake.out_of_order == 1 and mooncake.requests[-1].text == "Write a haiku about caches."
    azure = load_trace(str(FIXTURES / "azure.csv"))
    assert [r.input_tokens for r in azure.requests] == [180, 100, 9000, 250, 140] and azure.out_of_order == 1
    assert azure.requests[1].arrival_s == pytest.approx(0.052)
    burst = load_trace(str(FIXTURES / "burstgpt.csv"))
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in burst.requests] == [
        (0.0, 150, 9), (2.5, 220, 7), (4.0, 130, 11)]
    assert burst.dropped == {"failed in the trace (0 response tokens)": 1}


def test_the_shipped_azure_traces_hold_what_their_paper_says():
    conv, code = load_trace("azure-conv"), load_trace("azure-code")
    assert conv.workload == "chat" and code.workload == "code"
    conv_stats, code_stats = conv.stats(), code.stats()
    assert conv_stats["requests"] == 19366 and code_stats["requests"] == 8819
    assert conv_stats["rate"] == pytest.approx(5.53, abs=0.01) and code_stats["rate"] == pytest.approx(2.57, abs=0.01)
    assert conv_stats["input_p50"] == 1020 and conv_stats["output_p50"] == 129
    assert code_stats["input_p50"] == 1469 and code_stats["output_p50"] == 13


def test_the_shipped_mooncake_trace_holds_what_its_readme_says():
    """mooncake-conv: the FAST'25 conversation trace, gzipped (12,031 requests, 12,035 tokens in and
    343 out on average, its README), every request's prefix blocks kept for the prefix cache."""
    trace = load_trace("mooncake-conv")
    stats = trace.stats()
    assert trace.workload == "chat" and trace.hash_block_tokens == 512 and stats["requests"] == 12031
    assert sum(r.input_tokens for r in trace.requests) / 12031 == pytest.approx(12035, abs=1)
    assert sum(r.output_tokens for r in trace.requests) / 12031 == pytest.approx(343, abs=1)
    assert all(len(r.hash_ids) == -(-r.input_tokens // 512) for r in trace.requests[:100])


def test_requests_a_trace_recorded_at_one_instant_are_spread_up_to_its_next(tmp_path):
    """Mooncake's trace comes in 3 s buckets: the requests of one instant spread evenly until the next
    (the last instant's over the median gap), as the trace is read, so a served replay sends what
    `plan` simulates; a trace without ties is unchanged, and the replay says how many were moved."""
    import json

    import numpy as np

    from specbench.traces import spread_ties

    np.testing.assert_allclose(spread_ties(np.array([0, 0, 0, 0, 3, 3, 6.0])), [0, 0.75, 1.5, 2.25, 3, 4.5, 6])
    np.testing.assert_allclose(spread_ties(np.array([0, 2, 4, 4.0])), [0, 2, 4, 5])
    np.testing.assert_array_equal(spread_ties(np.array([0, 0.5, 2.0])), [0, 0.5, 2.0])
    rows = [{"timestamp": t, "input_length": 100 + i, "output_length": 5} for i, t in
            enumerate([3000, 0, 0, 3000, 6000])]
    (tmp_path / "bucketed.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    trace = load_trace(str(tmp_path / "bucketed.jsonl"))
    assert [(r.arrival_s, r.input_tokens) for r in trace.requests] == [
        (0.0, 101), (1.5, 102), (3.0, 100), (4.5, 103), (6.0, 104)]  # sorted stably, then spread
    assert trace.spread == 2 and load_trace(str(FIXTURES / "mooncake.jsonl")).spread == 0
    replayed = replay(trace, "1:10", speedup=2.0)
    assert [r.arrival_s for r in replayed.requests] == [0.0, 0.75, 1.5, 2.25]
    assert "2 of the trace's rows recorded at an earlier row's instant, spread evenly" in " ".join(replayed.notes())
    assert replayed.to_dict()["spread"] == 2
    assert load_trace("mooncake-conv").spread == 10851 and load_trace("azure-conv").spread == 0


def test_a_gzipped_mooncake_trace_reads_as_the_plain_one(tmp_path):
    import gzip

    plain = (FIXTURES / "mooncake.jsonl").read_bytes()
    (tmp_path / "mooncake.jsonl.gz").write_bytes(gzip.compress(plain))
    gzipped = load_trace(str(tmp_path / "mooncake.jsonl.gz"))
    assert gzipped.requests == load_trace(str(FIXTURES / "mooncake.jsonl")).requests and gzipped.name == "mooncake"
    (tmp_path / "broken.jsonl.gz").write_bytes(plain)  # not gzipped
    with pytest.raises(TraceError, match="broken.jsonl.gz: cannot be read as gzipped text"):
        load_trace(str(tmp_path / "broken.jsonl.gz"))


def test_a_replay_takes_its_window_scales_time_and_counts_what_it_leaves_out():
    trace = load_trace(str(FIXTURES / "azure.csv"))
    slice_ = replay(trace, "0:2", speedup=0.5, max_context=8192, min_input=64)
    assert [r.input_tokens for r in slice_.requests] == [180, 100, 250]  # 9000 + 14 does not fit 8192
    assert slice_.requests[1].arrival_s == pytest.approx(0.104)  # 0.052 s at half speed
    assert slice_.skipped == {"input + output beyond the target's context (8192 tokens)": 1}
    assert "sorted" in " ".join(slice_.notes()) and "skipped" in " ".join(slice_.notes())
    assert slice_.describe() == "azure 0–2 s at 0.5× speed"
    assert len(replay(trace, max_requests=2).requests) == 2
    short = replay(load_trace(str(FIXTURES / "mooncake.jsonl")), min_input=100)
    assert short.skipped == {"input shorter than the chat template alone (100 tokens)": 1}


@pytest.mark.parametrize("spec, window, message", [
    ("missing_column.csv", "", "an Azure LLM trace needs column(s) GeneratedTokens"),
    ("negative.jsonl", "", "line 2: timestamp is negative"),
    ("mooncake.jsonl", "100:10", "no request of mooncake arrives in 100–110 s"),
    ("too_long.jsonl", "", "none of the 2 request(s) in 0–0.01 s fits the target"),
    ("mooncake.jsonl", "abc", "expected START:DURATION"),
    ("mooncake.jsonl", "0:inf", "DURATION a finite number > 0"),
    ("no_such_file.jsonl", "", "no such file, and not a shipped trace"),
])
def test_bad_traces_are_one_line(spec, window, message):
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replay(load_trace(str(FIXTURES / spec)), window, max_context=8192)


@pytest.mark.parametrize("name, text, message", [
    # valid JSON that is not a request object was a TypeError (exit 4)
    ("list.jsonl", '{"timestamp": 0, "input_length": 9, "output_length": 5}\n[1,2,3]\n',
     "line 2 is JSON but not an object (list)"),
    ("number.jsonl", '5\n', "line 1 is JSON but not an object (int)"),
    # after a row BurstGPT marks failed (left out), errors still name the file's row, value and column
    ("burst.csv", "Timestamp,Model,Request tokens,Response tokens\n1,a,10,0\n2,a,10,5\n-3,a,10,5\n",
     "row 3: Timestamp is negative (-3)"),
    ("burst_input.csv", "Timestamp,Model,Request tokens,Response tokens\n1,a,10,0\n2,a,0,5\n",
     "row 2: Request tokens must be at least 1 (0)"),
    ("azure_text.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n2023-11-16 18:15:47,x,5\n",
     "row 2: ContextTokens is not a number ('x')"),
])
def test_bad_rows_are_named_as_the_file_has_them(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError) as error:
        load_trace(str(path))
    assert str(error.value) == f"--trace {path}: {message}" + (
        "; a Mooncake trace has one request object per line" if "not an object" in message else "")


def test_a_mooncake_traces_hash_ids_are_kept_with_their_requests(tmp_path):
    path = tmp_path / "shared.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 10, "input_length": 300, "output_length": 5}\n'
                    '{"timestamp": 20, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}\n')
    trace = load_trace(str(path))
    assert trace.hash_block_tokens == 512
    assert [r.hash_ids for r in trace.requests] == [(1, 2), (), (1, 2, 3)]
    played = replay(trace, "", 2.0)
    assert played.hash_block_tokens == 512 and played.requests[2].hash_ids == (1, 2, 3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": "abc"}\n')
    with pytest.raises(TraceError, match="line 1: hash_ids is not a list of integers"):
        load_trace(str(bad))


def test_a_traces_own_text_is_sent_as_it_is_when_it_has_the_requests_length():
    """A trace that carries its prompts (Mooncake's `text`) is sent as it is, so what its prompts share
    stays shared for a server's prefix cache; a text shorter than its request is made up to length."""
    from specbench.traces import TraceRequest
    from specbench.workloads import load_workload, trace_records

    def encode(record):  # a token a word, the chat template left out
        return " ".join(m["content"] for m in record.messages).split()

    shared = "word " * 300
    requests = [TraceRequest(0.0, 320, 4, shared + "first question " * 10),
                TraceRequest(1.0, 320, 4, shared + "second question " * 10),
                TraceRequest(2.0, 600, 4, "a short text")]
    built = trace_records(requests, load_workload("chat").records, "chat", encode, seed=0)
    assert built[0].messages[-1]["content"] == requests[0].text
    assert built[1].messages[-1]["content"].startswith(shared)
    assert "a short text" in built[2].messages[-1]["content"] and abs(len(encode(built[2])) - 600) <= 30
