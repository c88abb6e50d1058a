#!/usr/bin/env python3
"""hetkv batch end to end on the real model (SmolLM2: a real tokenizer and
chat template). One case per run:

    python3 tests/batch/test_batch.py BUILD_DIR MODEL CASE

CASE: format (output lines in the OpenAI batch format, special tokens in a raw
prompt, stop strings), bad_lines (each bad line answered by an error line
naming the problem, the job goes on), resume (SIGKILL at several points and a
torn last line, then the same command finishes with every custom_id exactly
once and the same tokens), sigterm (a clean stop with a non-zero exit),
invariance (greedy outputs identical with --max-batch 1 and 8, also under
ctkvr and snapkv with a small near tier), shard (--shard I/N splits the
lines), policies (laq and fastkv, whose prep
takes the whole prompt, run in a batch), mpi (mpirun -n 2: the same tokens as
one process, every custom_id once, both ranks decoding; a worker rank killed
mid-job fails the job and the rerun finishes it; skipped, 77, without mpirun),
prefix (--prefix-cache: questions over one shared document start from the
kept prefix, the summary counts the hits and the reused tokens, and the
tokens equal those without the cache, under full and ctkvr).
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

build, model, case = sys.argv[1], sys.argv[2], sys.argv[3]
hetkv = os.path.join(build, "tools", "hetkv")
src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if not os.path.exists(model):
    print(f"skip: {model} is missing (tools/scripts/get_model.sh fetches it)")
    sys.exit(77)
tmp = tempfile.mkdtemp(prefix="hkv_batch_")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def words():
    text = ""
    for p in ("README.md", "docs/ARCHITECTURE.md"):
        with open(os.path.join(src, p), encoding="utf-8") as f:
            text += f.read()
    return text.split()


WORDS = words()


def req(cid, n_words, max_tokens, chat, start=0, **extra):
    txt = " ".join(WORDS[start:start + n_words])
    if chat:
        body = {"messages": [{"role": "user", "content": "Summarise this: " + txt}]}
        url = "/v1/chat/completions"
    else:
        body = {"prompt": txt}
        url = "/v1/completions"
    body.update({"max_tokens": max_tokens, "temperature": 0})
    body.update(extra)
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def mixed(n, seed=1, longest=500):
    """n requests of mixed prompt lengths (a few words to several prefill chunks)."""
    out = []
    lens = [min(w, longest) for w in (3, 40, 120, 300, 60, 500, 10, 200)]
    for i in range(n):
        out.append(req(f"r{i}", lens[(i + seed) % len(lens)], [6, 16, 24][i % 3], i % 2 == 1,
                       start=(37 * i) % 2000))
    return out


def write_jsonl(path, reqs):
    with open(path, "w", encoding="utf-8") as f:
        for r in reqs:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def run(args, inp, out, timeout=300, **kw):
    cmd = [hetkv, "batch", "-m", model, "-i", inp, "-o", out, "-t", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def results(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f]


def by_id(lines):
    return {o["custom_id"]: o for o in lines}


def toks(lines):
    return {o["custom_id"]: o["hetkv"].get("tokens") for o in lines}


def case_format():
    reqs = [
        req("chat", 20, 12, True),
        req("comp", 20, 12, False),
        {"custom_id": "special", "url": "/v1/completions", "method": "POST",
         "body": {"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "max_tokens": 8,
                  "temperature": 0, "unknown_field": {"ignored": True}}},
        {"custom_id": "stop", "url": "/v1/completions", "method": "POST",
         "body": {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 30, "temperature": 0, "stop": [" 9"]}},
        {"custom_id": "ids", "url": "/v1/completions", "method": "POST",
         "body": {"prompt": [1, 2, 3, 4], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "seed": 3}},
        {"custom_id": "parts", "url": "/v1/chat/completions", "method": "POST",
         "body": {"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": [{"type": "text", "text": "Say hi."}]}],
                  "max_completion_tokens": 5, "temperature": 0, "n": 1, "stream": False}},
    ]
    inp, out = os.path.join(tmp, "f.jsonl"), os.path.join(tmp, "f.out.jsonl")
    write_jsonl(inp, reqs)
    p = run(["--json", "--max-batch", "4"], inp, out)
    check(p.returncode == 0, f"format: exit {p.returncode}: {p.stderr[-500:]}")
    summary = json.loads(p.stdout)
    check(summary["requests"] == 6 and summary["answered"] == 6 and summary["errors"] == 0,
          f"format: summary {summary}")
    check("hetkv batch: finished" in p.stderr, "format: no final summary on stderr")
    lines = results(out)
    r = by_id(lines)
    check(sorted(r) == sorted(x["custom_id"] for x in reqs), f"format: ids {sorted(r)}")
    for cid, o in r.items():
        check(o["id"].startswith("batch_req_") and o["error"] is None, f"format: {cid} envelope {o}")
        resp = o["response"]
        check(resp["status_code"] == 200, f"format: {cid} status {resp['status_code']}")
        b = resp["body"]
        chat = cid in ("chat", "parts")
        check(b["object"] == ("chat.completion" if chat else "text_completion"), f"format: {cid} object")
        ch = b["choices"]
        check(len(ch) == 1 and ch[0]["index"] == 0 and ch[0]["finish_reason"] in ("stop", "length"),
              f"format: {cid} choices {ch}")
        text = ch[0]["message"]["content"] if chat else ch[0]["text"]
        check(isinstance(text, str), f"format: {cid} text")
        if chat:
            check(ch[0]["message"]["role"] == "assistant", f"format: {cid} role")
        u = b["usage"]
        check(u["completion_tokens"] == len(o["hetkv"]["tokens"]) and
              u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], f"format: {cid} usage {u}")
        ext = o["hetkv"]
        for k in ("prefill_s", "decode_s", "ttft_s", "queue_s"):
            check(isinstance(ext.get(k), (int, float)) and ext[k] >= 0, f"format: {cid} hetkv.{k}")
        check(ext["policy"] == "full", f"format: {cid} policy {ext['policy']}")
    check(r["comp"]["response"]["body"]["usage"]["completion_tokens"] == 12 and
          r["comp"]["response"]["body"]["choices"][0]["finish_reason"] == "length", "format: max_tokens")
    check(r["parts"]["response"]["body"]["usage"]["completion_tokens"] <= 5, "format: max_completion_tokens")
    # special-token text in a raw prompt becomes the special tokens: the same
    # count as `hetkv run -p` (which now does the same), fewer than --no-special
    sp = r["special"]["response"]["body"]["usage"]["prompt_tokens"]
    prompt = reqs[2]["body"]["prompt"]
    runj = subprocess.run([hetkv, "run", "-m", model, "-p", prompt, "-n", "1", "--json", "-t", "2"],
                          capture_output=True, text=True, timeout=120)
    plain = subprocess.run([hetkv, "run", "-m", model, "-p", prompt, "-n", "1", "--json", "-t", "2",
                            "--no-special"], capture_output=True, text=True, timeout=120)
    n_run, n_plain = json.loads(runj.stdout)["n_prompt"], json.loads(plain.stdout)["n_prompt"]
    check(sp == n_run and n_plain > n_run, f"format: special tokens: batch {sp}, run {n_run}, "
          f"run --no-special {n_plain}")
    # greedy run -p gives the same tokens as the batch's completion
    check(json.loads(runj.stdout)["tokens"] == r["special"]["hetkv"]["tokens"][:1],
          "format: first token differs from hetkv run")
    st = r["stop"]
    text = st["response"]["body"]["choices"][0]["text"]
    check(" 9" not in text and st["hetkv"]["stop"] in ("stop_string", "eog", "length"),
          f"format: stop string: {text!r} {st['hetkv']['stop']}")
    check(st["hetkv"]["stop"] != "stop_string" or st["response"]["body"]["choices"][0]["finish_reason"] == "stop",
          "format: stop string finish_reason")


def case_bad_lines():
    ok = [req("ok1", 10, 4, False), req("ok2", 10, 4, True)]
    long_prompt = req("toolong", 400, 4, False)
    bad = [
        ("not json at all", None, "invalid JSON"),
        ('{"custom_id": "x1", "url": "/v1/completions", "body": {"prompt": "a"', None, "invalid JSON"),
        ('[1, 2]', None, "JSON object"),
        ({"url": "/v1/completions", "body": {"prompt": "a"}}, None, "custom_id"),
        ({"custom_id": "nourl", "body": {"prompt": "a"}}, "nourl", "url"),
        ({"custom_id": "badurl", "url": "/v1/embeddings", "body": {"input": "a"}}, "badurl", "/v1/embeddings"),
        ({"custom_id": "get", "method": "GET", "url": "/v1/completions", "body": {"prompt": "a"}}, "get", "POST"),
        ({"custom_id": "nobody", "url": "/v1/completions"}, "nobody", "body"),
        ({"custom_id": "nomsg", "url": "/v1/chat/completions", "body": {}}, "nomsg", "messages"),
        ({"custom_id": "role", "url": "/v1/chat/completions",
          "body": {"messages": [{"role": "tool", "content": "x"}]}}, "role", "role"),
        ({"custom_id": "image", "url": "/v1/chat/completions",
          "body": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}},
         "image", "only text parts"),
        ({"custom_id": "noprompt", "url": "/v1/completions", "body": {}}, "noprompt", "body.prompt"),
        ({"custom_id": "n2", "url": "/v1/completions", "body": {"prompt": "a", "n": 2}}, "n2", "n = 1"),
        ({"custom_id": "logprobs", "url": "/v1/completions", "body": {"prompt": "a", "logprobs": 3}},
         "logprobs", "logprobs"),
        ({"custom_id": "mt0", "url": "/v1/completions", "body": {"prompt": "a", "max_tokens": 0}},
         "mt0", "max_tokens"),
        ({"custom_id": "temp", "url": "/v1/completions", "body": {"prompt": "a", "temperature": 5}},
         "temp", "temperature"),
        ({"custom_id": "stop5", "url": "/v1/completions",
          "body": {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}}, "stop5", "stop"),
        ({"custom_id": "tokid", "url": "/v1/completions", "body": {"prompt": [1, 99999999]}},
         "tokid", "token id"),
        (long_prompt, "toolong", "context"),
        (req("ok1", 5, 4, False), "ok1", "repeats line"),
    ]
    inp, out = os.path.join(tmp, "b.jsonl"), os.path.join(tmp, "b.out.jsonl")
    lines = [ok[0]] + [b[0] for b in bad] + [ok[1]]
    write_jsonl(inp, lines)
    p = run(["--json", "-c", "256"], inp, out)
    check(p.returncode == 0, f"bad_lines: exit {p.returncode}: {p.stderr[-500:]}")
    res = results(out)
    check(len(res) == len(lines), f"bad_lines: {len(res)} result lines for {len(lines)} requests")
    byline = {o["hetkv"]["line"]: o for o in res}
    for i, (_, cid, frag) in enumerate(bad):
        o = byline.get(i + 2)
        if not o:
            check(False, f"bad_lines: no result for line {i + 2}")
            continue
        check(o["custom_id"] == cid, f"bad_lines: line {i + 2} custom_id {o['custom_id']!r} != {cid!r}")
        check(o["response"]["status_code"] == 400, f"bad_lines: line {i + 2} status")
        msg = o["response"]["body"]["error"]["message"]
        check(frag in msg, f"bad_lines: line {i + 2}: {msg!r} does not name {frag!r}")
    for k in (1, len(lines)):
        check(byline[k]["response"]["status_code"] == 200, f"bad_lines: good line {k} failed")
    s = json.loads(p.stdout)
    check(s["errors"] == len(bad) and s["answered"] == len(lines), f"bad_lines: summary {s}")
    # a request whose KV can never fit the budget is an error line; the others run
    inp2, out2 = os.path.join(tmp, "m.jsonl"), os.path.join(tmp, "m.out.jsonl")
    write_jsonl(inp2, [req("small", 5, 2, False), req("big", 5, 4000, False)])
    p = run(["--mem", "50M"], inp2, out2)
    r = by_id(results(out2))
    check(p.returncode == 0 and r["small"]["response"]["status_code"] == 200, "bad_lines: small under --mem")
    msg = r["big"]["response"]["body"].get("error", {}).get("message", "")
    check("never fit" in msg, f"bad_lines: big under --mem: {msg!r}")
    # the command's own errors: no output file written for them
    p = subprocess.run([hetkv, "batch", "-m", model, "-i", "/nonexistent/in.jsonl", "-o", out2],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 1 and "/nonexistent/in.jsonl" in p.stderr, f"bad_lines: missing input: {p.stderr}")
    p = subprocess.run([hetkv, "batch", "-m", model, "-i", inp2], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "-o OUT.jsonl" in p.stderr, f"bad_lines: no -o: {p.stderr}")
    # an output file that is not ours is refused, not appended to
    foreign = os.path.join(tmp, "foreign.jsonl")
    with open(foreign, "w") as f:
        f.write('{"hello": 1}\n')
    p = run([], inp2, foreign)
    check(p.returncode == 1 and "not a result" in p.stderr, f"bad_lines: foreign output: {p.stderr}")


def case_resume():
    reqs = mixed(14, longest=200)
    inp = os.path.join(tmp, "r.jsonl")
    write_jsonl(inp, reqs)
    ref_out = os.path.join(tmp, "r.ref.jsonl")
    p = run(["-q", "--max-batch", "4", "--chunk", "64"], inp, ref_out)
    check(p.returncode == 0, f"resume: reference run: {p.stderr[-300:]}")
    ref = toks(results(ref_out))
    out = os.path.join(tmp, "r.out.jsonl")
    cmd = [hetkv, "batch", "-m", model, "-i", inp, "-o", out, "-t", "2", "-q", "--max-batch", "4",
           "--chunk", "64"]
    kills = 0
    for stop_at in (1, 4, 9):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while proc.poll() is None and time.time() - t0 < 120:
            n = sum(1 for _ in open(out)) if os.path.exists(out) else 0
            if n >= stop_at:
                proc.kill()
                kills += 1
                break
            time.sleep(0.02)
        proc.wait()
        if stop_at == 4:   # a torn last line, as a kill mid-write leaves it
            with open(out, "a") as f:
                f.write('{"id":"batch_req_99","custom_id":"r1","resp')
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"resume: final run exit {p.returncode}: {p.stderr[-300:]}")
    check(kills >= 2, f"resume: only {kills} runs were killed mid-job")
    res = results(out)   # every line parses: the torn one was cut
    ids = [o["custom_id"] for o in res]
    check(sorted(ids) == sorted(r["custom_id"] for r in reqs),
          f"resume: custom_ids not exactly once: {sorted(ids)}")
    got = toks(res)
    diff = [k for k in ref if ref[k] != got.get(k)]
    check(not diff, f"resume: tokens differ from the uninterrupted run for {diff}")
    # run again: nothing left to do, nothing appended
    p = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120)
    s = json.loads(p.stdout)
    check(p.returncode == 0 and s["answered"] == 0 and s["earlier"] == len(reqs) and len(results(out)) == len(reqs),
          f"resume: a finished job rerun: {s}")


def case_sigterm():
    reqs = mixed(12, seed=3)
    inp, out = os.path.join(tmp, "s.jsonl"), os.path.join(tmp, "s.out.jsonl")
    write_jsonl(inp, reqs)
    cmd = [hetkv, "batch", "-m", model, "-i", inp, "-o", out, "-t", "2", "--max-batch", "2"]
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while time.time() - t0 < 120 and proc.poll() is None:
            if os.path.exists(out) and sum(1 for _ in open(out)) >= (2 if sig == signal.SIGTERM else 5):
                break
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        check(proc.returncode == 128 + sig, f"sigterm: {sig.name} exit {proc.returncode} (want {128 + sig})")
        check("stopped by signal" in err and "interrupted" in err, f"sigterm: {sig.name} stderr {err[-300:]}")
        with open(out, "rb") as f:
            data = f.read()
        check(data.endswith(b"\n"), f"sigterm: {sig.name} left a torn line")
        n = len(results(out))
        check(0 < n < len(reqs), f"sigterm: {sig.name}: {n} lines (the job should stop midway)")
    p = subprocess.run(cmd + ["-q"], capture_output=True, text=True, timeout=300)
    ids = sorted(o["custom_id"] for o in results(out))
    check(p.returncode == 0 and ids == sorted(r["custom_id"] for r in reqs), f"sigterm: rerun {p.returncode} {ids}")


def case_invariance():
    reqs = mixed(12, seed=5, longest=160)
    inp = os.path.join(tmp, "i.jsonl")
    write_jsonl(inp, reqs)
    for extra in ([], ["--policy", "ctkvr", "--sink", "4", "--local", "32"],
                  ["--policy", "snapkv", "--policy-arg", "budget=48", "--sink", "4", "--local", "32"]):
        outs = []
        for b in ("1", "8"):
            out = os.path.join(tmp, f"i{b}_{len(extra)}.jsonl")
            p = run(["-q", "--max-batch", b, "--chunk", "64", *extra], inp, out)
            check(p.returncode == 0, f"invariance {extra} b={b}: {p.stderr[-300:]}")
            outs.append(toks(results(out)))
        diff = [k for k in outs[0] if outs[0][k] != outs[1].get(k)]
        check(len(outs[0]) == len(reqs) and not diff,
              f"invariance {' '.join(extra) or 'full'}: --max-batch 1 and 8 differ for {diff}")


def case_policies():
    reqs = mixed(6, seed=2)
    inp = os.path.join(tmp, "p.jsonl")
    write_jsonl(inp, reqs)
    for pol in (["--policy", "laq"], ["--policy", "fastkv"]):
        out = os.path.join(tmp, f"p_{pol[1]}.jsonl")
        p = run(["-q", "--max-batch", "3", "--sink", "4", "--local", "32", *pol], inp, out)
        check(p.returncode == 0, f"policies {pol[1]}: exit {p.returncode}: {p.stderr[-300:]}")
        res = results(out)
        check(len(res) == len(reqs) and all(o["response"]["status_code"] == 200 for o in res)
              and all(o["hetkv"]["policy"] == pol[1] for o in res), f"policies {pol[1]}: {res[:1]}")


def device_backend():
    """The CUDA backend hetkv was built with (cuda-emu, cuda) or None."""
    p = subprocess.run([hetkv, "info", "--json"], capture_output=True, text=True)
    try:
        return json.loads(p.stdout).get("cuda", {}).get("backend") if p.returncode == 0 else None
    except ValueError:
        return None


def prefix_reqs(n_q, max_tokens=4):
    """n_q questions over one 300-word document and a request that shares nothing.
    The document is frozen (prefix_doc.txt: README's first 300 words as of
    2026-11-29): whether every question's last whole chunk is the kept prefix's end
    depends on where its tokens fall, and README's text moves."""
    with open(os.path.join(src, "tests", "batch", "prefix_doc.txt"), encoding="utf-8") as f:
        doc = f.read().strip()
    qs = ["Who wrote it?", "What is it about?", "Name one command.", "How is it tested?",
          "Which GPU?"][:n_q]
    reqs = [{"custom_id": f"x{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": doc + "\n\nQuestion: " + q}],
                      "max_tokens": max_tokens, "temperature": 0}} for i, q in enumerate(qs)]
    reqs.append(req("other", 30, max_tokens, True, start=900))   # shares nothing
    return reqs, qs


def case_prefix():
    reqs, qs = prefix_reqs(5)
    inp = os.path.join(tmp, "x.jsonl")
    write_jsonl(inp, reqs)
    for extra in ([], ["--policy", "ctkvr", "--sink", "4", "--local", "32"]):
        name = extra[1] if extra else "full"
        outs = []
        for pc in ("0", "2"):
            out = os.path.join(tmp, f"x{pc}_{name}.jsonl")
            p = run(["--json", "--max-batch", "2", "--chunk", "64", "--prefix-cache", pc, *extra],
                    inp, out)
            check(p.returncode == 0, f"prefix {name} --prefix-cache {pc}: {p.stderr[-300:]}")
            outs.append(toks(results(out)))
            summ = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
            if pc == "2":
                pcs = summ.get("prefix_cache", {})
                # the second, admitted beside the first, finds its prefix before its first
                # chunk (prompts are prefilled one at a time); the tiered cache shares the
                # rows by reference: KV bytes saved
                check(pcs.get("hits", 0) >= len(qs) - 1 and pcs.get("reused_tokens", 0) >= 64 * 4
                      and pcs.get("saved_bytes", 0) > 0,
                      f"prefix {name}: hits, reused tokens and saved bytes {pcs}")
                # ctkvr shares its index: every request builds it at its last whole
                # chunk (or takes the kept one built there), full has none to share
                if extra:
                    check(pcs.get("index_builds", 0) >= 1 and pcs.get("index_hits", 0) >= 1 and
                          pcs["index_builds"] + pcs["index_hits"] >= len(qs),
                          f"prefix {name}: index builds and hits {pcs}")
                else:
                    check(pcs.get("index_builds") == 0 and pcs.get("index_hits") == 0,
                          f"prefix {name}: an index shared under full {pcs}")
            else:
                check("prefix_cache" not in summ, f"prefix {name}: a summary without the cache: {summ}")
        diff = [k for k in outs[0] if outs[0][k] != outs[1].get(k)]
        # full: the same tokens with and without the cache. ctkvr's index of a prompt
        # is built in two steps with the cache on (at its last whole chunk, then the
        # rest as a later turn), so its tokens may differ from the cache-off run's
        # (docs/POLICIES.md, "Over a shared prefix"); here they do not
        check(len(outs[0]) == len(reqs) and len(outs[1]) == len(reqs) and (extra or not diff),
              f"prefix {name}: tokens with and without --prefix-cache differ for {diff}")
        # batch invariance with sharing on: one request at a time, and all at once;
        # a request's tokens do not depend on whether it found a kept prefix
        for b in ("1", "6"):
            out = os.path.join(tmp, f"x_b{b}_{name}.jsonl")
            p = run(["-q", "--max-batch", b, "--chunk", "64", "--prefix-cache", "2", *extra], inp, out)
            got = toks(results(out))
            diff = [k for k in outs[1] if outs[1][k] != got.get(k)]
            check(p.returncode == 0 and not diff,
                  f"prefix {name}: --max-batch {b} with the cache differs for {diff}: {p.stderr[-200:]}")
    p = run(["--prefix-cache", "999"], inp, os.path.join(tmp, "x_bad.jsonl"))
    check(p.returncode == 2 and "--prefix-cache" in p.stderr, f"prefix: 999 kept prefixes: {p.stderr[-200:]}")


def case_prefix_device():
    """The prefix cache with --device cuda (on the CUDA emulator: slow suite): the far
    tier is page-locked there by registration, and a hit maps the prefix's pages
    over its own (registered again) as on the host path, so the far-tier bytes
    saved are the host path's; a hit's rest of the prompt is attended by the host
    (a later turn); the tokens are the host path's with the cache, under full and
    ctkvr."""
    if device_backend() != "cuda-emu":
        print(f"skip: hetkv runs no CUDA emulator here ({device_backend()!r})")
        sys.exit(77)
    reqs, qs = prefix_reqs(3, max_tokens=3)
    inp = os.path.join(tmp, "xd.jsonl")
    write_jsonl(inp, reqs)
    saved = []
    for pol in (["--policy", "full"], ["--policy", "ctkvr", "--sink", "4", "--local", "32"]):
        got = []
        for dev in ("cpu", "cuda"):
            out = os.path.join(tmp, f"xd_{dev}_{pol[1]}.jsonl")
            p = run(["--json", "--max-batch", "2", "--chunk", "64", "--prefix-cache", "2",
                     "--device", dev, *pol], inp, out, timeout=1200)
            summ = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
            check(p.returncode == 0 and summ.get("prefix_cache", {}).get("hits", 0) >= len(qs) - 1,
                  f"prefix {pol[1]} --device {dev}: exit {p.returncode}, {summ.get('prefix_cache')}: "
                  f"{p.stderr[-300:]}")
            got.append(toks(results(out)) if p.returncode == 0 else {})
            saved.append(summ.get("prefix_cache", {}).get("saved_bytes", 0))
        check(saved[-1] > 0 and saved[-1] == saved[-2],
              f"prefix {pol[1]}: far-tier bytes saved on the device {saved[-1]}, host {saved[-2]}")
        diff = [k for k in got[0] if got[0][k] != got[1].get(k)]
        check(len(got[0]) == len(reqs) and not diff,
              f"prefix {pol[1]}: tokens on the device differ from the host path's for {diff}")


def case_shard():
    reqs = [req(f"s{i}", 5 + i, 3, i % 2 == 0) for i in range(7)]
    inp = os.path.join(tmp, "sh.jsonl")
    write_jsonl(inp, reqs)
    seen = []
    for i in range(3):
        out = os.path.join(tmp, f"sh{i}.jsonl")
        p = run(["-q", "--json", "--shard", f"{i}/3"], inp, out)
        check(p.returncode == 0, f"shard {i}/3: {p.stderr[-300:]}")
        res = results(out)
        check(all((o["hetkv"]["line"] - 1) % 3 == i for o in res), f"shard {i}/3: lines of another shard")
        check(json.loads(p.stdout)["requests"] == len(res), f"shard {i}/3: summary count")
        seen += [o["custom_id"] for o in res]
    check(sorted(seen) == sorted(r["custom_id"] for r in reqs), f"shard: union {sorted(seen)}")
    p = run(["--shard", "3/3"], inp, os.path.join(tmp, "shx.jsonl"))
    check(p.returncode == 2 and "out of range" in p.stderr, f"shard: 3/3 accepted: {p.stderr}")


def mpirun_cmd(n):
    # as root in CI containers Open MPI wants both flags; --oversubscribe: 2 ranks on 2 cores
    return ["mpirun", "--oversubscribe", "--allow-run-as-root", "-n", str(n),
            "-x", "OMP_NUM_THREADS=1"]


def case_mpi():
    import shutil
    if not shutil.which("mpirun"):
        print("skip: no mpirun (install openmpi-bin)")
        sys.exit(77)
    info = subprocess.run([hetkv, "batch", "--help"], capture_output=True, text=True)
    if "Under MPI" not in info.stdout:
        print("skip: this hetkv has no MPI")
        sys.exit(77)
    reqs = mixed(16, seed=3, longest=300)
    inp = os.path.join(tmp, "m.jsonl")
    write_jsonl(inp, reqs)
    one = os.path.join(tmp, "m1.jsonl")
    p = run(["-q", "--max-batch", "4", "--chunk", "64", "-t", "1"], inp, one)
    check(p.returncode == 0, f"mpi: one process: {p.stderr[-300:]}")
    two = os.path.join(tmp, "m2.jsonl")
    cmd = mpirun_cmd(2) + [hetkv, "batch", "-m", model, "-i", inp, "-o", two, "-t", "1",
                           "--max-batch", "4", "--chunk", "64", "--json", "-q"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    check(p.returncode == 0, f"mpi: 2 ranks: exit {p.returncode}: {p.stderr[-500:]}")
    res = results(two)
    ids = [o["custom_id"] for o in res]
    check(sorted(ids) == sorted(r["custom_id"] for r in reqs), f"mpi: ids {sorted(ids)}")
    check(toks(res) == toks(results(one)), "mpi: 2 ranks' tokens differ from one process's")
    try:
        summ = json.loads(p.stdout.strip().splitlines()[-1])
        check(summ["ranks"] == 2 and summ["answered"] == len(reqs)
              and len(summ["answered_by_rank"]) == 2 and min(summ["answered_by_rank"]) > 0
              and sum(summ["answered_by_rank"]) == len(reqs), f"mpi: summary {summ}")
        print(f"mpi: 2 ranks answered {summ['answered_by_rank']}")
    except (ValueError, IndexError, KeyError) as e:
        check(False, f"mpi: summary: {e}: {p.stdout[-300:]}")
    # A worker killed mid-job (once rank 0 has written 3 results): the job fails, what rank 0
    # wrote stays, and the rerun (one process: resuming does not depend on the ranks) finishes it.
    three = os.path.join(tmp, "m3.jsonl")
    cmd = mpirun_cmd(2) + ["sh", "-c", f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then '
                           f'(until [ -s "{three}" ] && [ $(wc -l < "{three}") -ge 3 ]; do sleep 0.1; done; '
                           f'kill -9 $$) & fi; exec "{hetkv}" batch -m "{model}" '
                           f'-i "{inp}" -o "{three}" -t 1 --max-batch 4 --chunk 64 -q']
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    check(p.returncode != 0, f"mpi: a killed worker did not fail the job (exit {p.returncode})")
    part = results(three) if os.path.exists(three) else []
    print(f"mpi: worker killed: exit {p.returncode}, {len(part)} of {len(reqs)} answered; "
          f"{p.stderr.strip().splitlines()[-1:] if p.stderr.strip() else ''}")
    check(0 < len(part) < len(reqs), f"mpi: the kill came at {len(part)} of {len(reqs)} answered")
    p = run(["-q", "--max-batch", "4", "--chunk", "64", "-t", "1"], inp, three)
    check(p.returncode == 0, f"mpi: rerun after the kill: {p.stderr[-300:]}")
    res = results(three)
    ids = [o["custom_id"] for o in res]
    check(sorted(ids) == sorted(r["custom_id"] for r in reqs),
          f"mpi: after the kill ({len(part)} answered) and the rerun: ids {sorted(ids)}")
    check(toks(res) == toks(results(one)), "mpi: after the rerun the tokens differ")


{"mpi": case_mpi, "prefix": case_prefix, "prefix_device": case_prefix_device, "format": case_format, "shard": case_shard, "bad_lines": case_bad_lines, "resume": case_resume, "sigterm": case_sigterm,
 "invariance": case_invariance, "policies": case_policies}[case]()
print(f"batch {case}: {len(failures)} failures")
sys.exit(1 if failures else 0)
