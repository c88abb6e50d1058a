#!/usr/bin/env python3
"""hetkv serve over real HTTP on 127.0.0.1, with the official openai client and
raw http.client requests. One case per run:

    python3 tests/serve/test_serve.py BUILD_DIR SMOLLM2_MODEL CASE

Cases on a tiny generated model (tools/scripts/gen_tiny_gguf.py; no download):
  protocol    status codes and error objects: health, models, API key (401),
              malformed JSON (400), a body past --max-body (413), max_tokens
              negative or past the context (400), a prompt longer than the
              context, a KV past --mem, 404/405, unknown fields ignored, the
              policy field, a port in use, a non-loopback bind warned about
  queue       a burst past --max-batch + --max-queue: 503 with Retry-After, the
              rest answered; the metrics count the refusals and return to idle;
              a request waiting in the scheduler's queue whose client leaves is
              taken out of it (hkv_sched_cancel on a queued request)
  shutdown    SIGTERM with a stream in flight: the stream ends, exit 0
Cases on SmolLM2 (exit 77 when it is absent; tools/scripts/get_model.sh fetches it):
  stream      completion and chat through the openai client, streamed and not:
              the streamed text equals the whole one; stop strings; seeded sampling
  concurrent  32 concurrent clients: each greedy answer equals the same request
              sent alone and, for raw prompts, `hetkv run`; throughput printed
  disconnect  clients dropped mid-stream and mid-request: their sequences are
              freed (metrics back to idle, KV tiers empty), the server keeps serving
  policy      requests naming their own KV policy (full, snapkv, quest, ctkvr) in one
              batch: each equals `hetkv run` under that policy; refusals are 400s
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

build, smollm, case = sys.argv[1], sys.argv[2], sys.argv[3]
hetkv = os.path.join(build, "tools", "hetkv")
src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
tmp = tempfile.mkdtemp(prefix="hkv_serve_")
failures = []

try:
    import openai
except ImportError:
    print("skip: the openai package is missing (pip install -r tests/requirements.txt)")
    sys.exit(77)
probe = subprocess.run([hetkv, "serve", "--help"], capture_output=True, text=True)
if probe.returncode != 0:
    print("skip: this hetkv has no serve command:", probe.stderr.strip())
    sys.exit(77)


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, flush=True)
    return cond


def tiny_model(ctx=512):
    path = os.path.join(tmp, f"tiny{ctx}.gguf")
    subprocess.run([sys.executable, os.path.join(src, "tools", "scripts", "gen_tiny_gguf.py"), "--preset",
                    "llama_gqa3_q41", "--ctx", str(ctx), "-o", path], check=True, capture_output=True)
    return path


def real_model():
    if not os.path.exists(smollm):
        print(f"skip: {smollm} is missing (tools/scripts/get_model.sh fetches it)")
        sys.exit(77)
    return smollm


class Server:
    """hetkv serve on a free port (--port 0: it prints the port it bound)."""

    def __init__(self, model, *args):
        self.model = model
        self.p = subprocess.Popen([hetkv, "serve", "-m", model, "--port", "0", "-t", "2", *args],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def drain():   # keep reading stderr so the server never blocks on it
            for line in self.p.stderr:
                self.lines.append(line)
                m = re.search(r"listening on http://[^ ]*:(\d+) ", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.t = threading.Thread(target=drain, daemon=True)
        self.t.start()
        if not ready.wait(120) or self.port is None:
            self.p.kill()
            raise SystemExit("FAIL: the server did not start: " + "".join(self.lines))
        self.base = f"http://127.0.0.1:{self.port}"

    def client(self, key="none", **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, **kw)

    def http(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def gives_up(self, body, after):
        """A completion whose client leaves after `after` s: True when it had no answer by then."""
        try:
            self.http("POST", "/v1/completions", body, timeout=after)
            return False
        except (socket.timeout, TimeoutError):
            return True

    def metrics(self, headers=None):
        st, _, data = self.http("GET", "/metrics", headers=headers)
        check(st == 200, f"metrics: status {st}")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_idle(self, headers=None, timeout=30):
        """The metrics at idle: nothing in flight, no KV reserved, KV tiers empty."""
        end = time.time() + timeout
        while True:
            m = self.metrics(headers)
            busy = {k: m.get(k) for k in ("hetkv_requests_in_flight", "hetkv_sequences_running",
                                          "hetkv_sequences_queued", "hetkv_kv_reserved_bytes",
                                          'hetkv_memory_bytes{tier="near"}',
                                          'hetkv_memory_bytes{tier="far"}',
                                          'hetkv_memory_bytes{tier="index"}') if m.get(k)}
            if not busy or time.time() > end:
                check(not busy, f"not idle after {timeout} s: {busy}")
                return m
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = "timeout"
        self.t.join(5)
        return rc, "".join(self.lines)


def error_of(data):
    try:
        e = json.loads(data)["error"]
        return e if isinstance(e.get("message"), str) and isinstance(e.get("type"), str) else None
    except (ValueError, KeyError, TypeError):
        return None


def words(n, start=0):
    with open(os.path.join(src, "README.md"), encoding="utf-8") as f:
        w = f.read().split()
    return " ".join(w[start:start + n])


# ---------------------------------------------------------------- tiny model

def case_protocol():
    key = "s3cret-key"
    s = Server(tiny_model(), "--api-key", key, "--max-body", "64K", "--ctx", "256", "--max-batch", "2")
    auth = {"Authorization": "Bearer " + key}
    try:
        st, _, data = s.http("GET", "/health")
        check(st == 200 and json.loads(data)["status"] == "ok", f"health without a key: {st} {data}")
        for hdr in ({}, {"Authorization": "Bearer wrong-key!"}, {"Authorization": "Bearer " + key + "x"},
                    {"Authorization": key}):
            st, h, data = s.http("GET", "/v1/models", headers=hdr)
            check(st == 401 and error_of(data) and "www-authenticate" in h, f"models with {hdr}: {st} {data}")
        st, _, data = s.http("GET", "/v1/models", headers=auth)
        check(st == 200 and json.loads(data)["data"][0]["object"] == "model", f"models: {st} {data}")
        try:
            s.client("wrong").completions.create(model="m", prompt="hi", max_tokens=2)
            check(False, "openai client with a wrong key: no error")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, f"openai wrong key: {e}")
        c = s.client(key)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}],
                                      max_tokens=5, temperature=0)
        check(r.choices[0].message.role == "assistant" and isinstance(r.choices[0].message.content, str)
              and r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 1, f"chat on tiny: {r}")
        post = lambda body, path="/v1/completions", **kw: s.http("POST", path, body, auth, **kw)
        st, _, data = post('{"prompt": "abc", "max_tokens": ')
        check(st == 400 and error_of(data) and "invalid JSON" in error_of(data)["message"],
              f"malformed JSON: {st} {data}")
        st, _, data = post("[1, 2]")
        check(st == 400 and error_of(data), f"a JSON array body: {st} {data}")
        st, _, data = post({"prompt": "x" * (100 << 10), "max_tokens": 1})
        check(st == 413 and error_of(data), f"a 100 KiB body past --max-body 64K: {st} {data}")
        # a declared length far past the limit is refused before the body is read
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n{{".encode())
        head = sock.recv(4096).decode(errors="replace")
        sock.close()
        check(head.startswith("HTTP/1.1 413"), f"a declared 1 GiB body: {head[:80]!r}")
        for mt in (-1, 0, "ten", 1.5):
            st, _, data = post({"prompt": "abc", "max_tokens": mt})
            check(st == 400 and error_of(data), f"max_tokens {mt}: {st} {data}")
        st, _, data = post({"prompt": "abc", "max_tokens": 1000})
        e = error_of(data)
        check(st == 400 and e and e["code"] == "context_length_exceeded", f"max_tokens past the context: {st} {data}")
        st, _, data = post({"prompt": "abc " * 400, "max_tokens": 4})
        check(st == 400 and error_of(data), f"a prompt longer than the context: {st} {data}")
        st, h, data = post({"prompt": "abc", "max_tokens": 1000, "stream": True})
        check(st == 400 and h.get("content-type") == "application/json" and error_of(data),
              f"stream past the context: a 400 before any event: {st} {data}")
        st, _, data = post({"messages": [{"role": "robot", "content": "x"}]}, "/v1/chat/completions")
        check(st == 400 and error_of(data), f"a bad role: {st} {data}")
        st, _, data = post({"prompt": "abc", "max_tokens": 3, "temperature": 0,
                            "some_future_field": {"x": 1}, "user": "u1", "policy": "full"})
        check(st == 200 and json.loads(data)["object"] == "text_completion",
              f"unknown fields ignored, the server's own policy accepted: {st} {data}")
        st, _, data = post({"prompt": "abc", "max_tokens": 3, "policy": "speckv"})
        check(st == 400 and "speckv" in error_of(data)["message"],
              f"a policy preparing the prompt, per request: {st} {data}")
        st, _, data = s.http("GET", "/v1/nothing", headers=auth)
        check(st == 404 and error_of(data), f"unknown path: {st}")
        st, _, data = s.http("GET", "/v1/completions", headers=auth)
        check(st == 405 and error_of(data), f"GET a POST endpoint: {st}")
        st, _, data = s.http("POST", "/v1/completions", {"prompt": "abc", "max_tokens": 2})
        check(st == 401, f"a completion without a key: {st}")
        p = subprocess.run([hetkv, "serve", "-m", s.model, "--port", str(s.port), "-t", "1"],
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 1 and "cannot listen" in p.stderr, f"a port in use: {p.returncode} {p.stderr[-300:]}")
        p = subprocess.run([hetkv, "serve", "-m", s.model, "--max-body", "12"], capture_output=True,
                           text=True, timeout=60)
        check(p.returncode == 2 and "--max-body" in p.stderr, f"a bad option: {p.returncode} {p.stderr[-300:]}")
        m = s.wait_idle(auth)
        for code, least in (("200", 3), ("400", 11), ("401", 5), ("413", 2), ("404", 1), ("405", 1)):
            n = m.get(f'hetkv_requests_total{{code="{code}"}}', 0)
            check(n >= least, f"metrics: {n} responses with {code}, expected at least {least}")
        check(m.get("hetkv_generation_tokens_total", 0) >= 4, f"metrics: generated tokens {m}")
        check(m.get('hetkv_memory_bytes{tier="weights"}', 0) > 0, "metrics: no weights tier")
    finally:
        rc, err = s.stop()
    check(rc == 0 and "stopped" in err, f"SIGTERM at idle: exit {rc}: {err[-500:]}")
    check("warning" not in err, f"a warning on 127.0.0.1 with a key: {err[-300:]}")
    s = Server(tiny_model(), "--host", "0.0.0.0")   # every address, no key: warned
    st, _, _ = s.http("GET", "/v1/models")
    rc, err = s.stop()
    check(st == 200 and rc == 0 and "warning" in err and "--api-key" in err,
          f"no warning for 0.0.0.0 without a key: {st} {rc} {err[-300:]}")
    s = Server(tiny_model(), "--mem", "64K")   # no request's KV can ever fit: 400, not a wait
    st, _, data = s.http("POST", "/v1/completions", {"prompt": "abc", "max_tokens": 8})
    s.wait_idle()
    rc, err = s.stop()
    check(st == 400 and "memory budget" in error_of(data)["message"] and rc == 0,
          f"a request past --mem: {st} {data[:300]} exit {rc}")


def burst(s, n, body):
    """n requests at once, each on its own connection: [(status, headers, data)]."""
    out = [None] * n
    go = threading.Barrier(n)

    def one(i):
        go.wait()
        try:
            out[i] = s.http("POST", "/v1/completions", body, timeout=300)
        except Exception as e:   # noqa: BLE001 - reported as a failure below
            out[i] = (0, {}, repr(e).encode())

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def case_queue():
    s = Server(tiny_model(), "--max-batch", "2", "--max-queue", "2", "--ctx", "512")
    try:
        body = {"prompt": "one two three", "max_tokens": 480, "temperature": 0}
        res = burst(s, 12, body)
        ok = [r for r in res if r[0] == 200]
        busy = [r for r in res if r[0] in (429, 503)]
        check(len(ok) + len(busy) == 12, f"queue: other statuses {[(r[0], r[2][:100]) for r in res]}")
        check(len(ok) >= 4, f"queue: {len(ok)} answered; 2 running + 2 queued should be")
        check(len(busy) >= 1, "queue: no request refused in a burst of 12 past 2 + 2")
        for r in busy:
            check(r[1].get("retry-after", "").isdigit() and error_of(r[2]), f"queue: refusal {r}")
        texts = {json.loads(r[2])["choices"][0]["text"] for r in ok}
        check(len(texts) == 1, f"queue: the same greedy request answered differently: {texts}")
        m = s.wait_idle()
        check(m.get("hetkv_admission_refused_total") == len(busy),
              f"queue: admission_refused_total {m.get('hetkv_admission_refused_total')} != {len(busy)}")
        st, _, data = s.http("POST", "/v1/completions", dict(body, max_tokens=3))
        check(st == 200, f"queue: a request after the burst: {st} {data}")
    finally:
        rc, err = s.stop()
    check(rc == 0, f"queue: exit {rc}: {err[-500:]}")
    # a request waiting in the scheduler's queue whose client leaves is taken out of it
    # 16000 tokens each: the two running requests must outlast the third's 1 s
    # wait (4000 took 0.9 s for both on a 2-core AMD EPYC, and the third then
    # ran instead of waiting in the queue)
    s = Server(tiny_model(ctx=16384), "--max-batch", "2", "--ctx", "16384", "--drain", "0")
    try:
        long = {"prompt": "one", "max_tokens": 16000, "temperature": 0}
        for _ in range(2):
            threading.Thread(target=lambda: s.http("POST", "/v1/completions", long), daemon=True).start()
        end = time.time() + 30
        while s.metrics().get("hetkv_sequences_running", 0) < 2 and time.time() < end:
            time.sleep(0.01)
        seen_queued = [0]

        def watch():
            while not seen_queued[0] and time.time() < end:
                seen_queued[0] = s.metrics().get("hetkv_sequences_queued", 0)

        w = threading.Thread(target=watch)
        w.start()
        check(s.gives_up(long, 1.0), "queue: a third 16000-token request answered within 1 s")
        w.join()
        end = time.time() + 10
        while s.metrics().get("hetkv_sequences_queued", 1) and time.time() < end:
            time.sleep(0.05)
        m = s.metrics()
        check(seen_queued[0] == 1, f"queue: the third request was never seen queued ({seen_queued[0]})")
        check(m.get("hetkv_requests_cancelled_total") == 1 and m.get("hetkv_sequences_queued") == 0,
              f"queue: after the queued client left: {m}")
    finally:
        rc, err = s.stop()   # --drain 0: the two long ones are cut
    check(rc == 0, f"queue (cancel while queued): exit {rc}: {err[-500:]}")


def case_shutdown():
    model = tiny_model(ctx=4096)
    # --drain 0: a stream in flight is cut with an error event, the exit is clean
    s = Server(model, "--ctx", "4096", "--drain", "0")
    stream = s.client().completions.create(model="m", prompt="one two", max_tokens=4000,
                                           temperature=0, stream=True)
    first = next(iter(stream))
    check(first.object == "text_completion", f"shutdown: first chunk {first}")
    whole = {}   # and a whole-response request: it gets its 503 before the connections close

    def ask_whole():
        try:
            whole["r"] = s.http("POST", "/v1/completions", {"prompt": "two", "max_tokens": 4000})
        except Exception as e:   # noqa: BLE001 - reported below
            whole["r"] = (0, {}, repr(e).encode())

    tw = threading.Thread(target=ask_whole)
    tw.start()
    end = time.time() + 30
    while s.metrics().get("hetkv_sequences_running", 0) < 2 and time.time() < end:
        time.sleep(0.01)
    t0 = time.time()
    s.p.send_signal(signal.SIGTERM)
    ended = None
    try:
        for _ in stream:
            pass
        ended = "finished"
    except openai.APIError as e:
        ended = f"error event: {e}"
    except Exception as e:   # noqa: BLE001 - a cut connection is also an end
        ended = f"cut: {e!r}"
    tw.join(30)
    rc, err = s.stop(timeout=30)
    el = time.time() - t0
    w = whole.get("r")
    check(w and w[0] == 503 and error_of(w[2]) and "shut down" in error_of(w[2])["message"],
          f"shutdown: the whole-response request in flight: {w and (w[0], w[2][:200])}")
    check(ended.startswith("error event") and "shut down" in ended, f"shutdown: the stream {ended}")
    check(rc == 0 and "signal 15" in err and "stopped" in err, f"shutdown: exit {rc}: {err[-500:]}")
    check(el < 10, f"shutdown took {el:.1f} s with --drain 0")
    print(f"shutdown --drain 0: stream {ended}; exit {rc} after {el:.2f} s")
    # --drain 30: a request in flight finishes, later ones are refused, then the exit
    s = Server(model, "--ctx", "4096", "--drain", "30")
    res = {}
    t = threading.Thread(target=lambda: res.update(r=s.http(
        "POST", "/v1/completions", {"prompt": "one", "max_tokens": 4000, "temperature": 0})))
    t.start()
    end = time.time() + 10
    while s.metrics().get("hetkv_sequences_running", 0) < 1 and time.time() < end:
        time.sleep(0.01)
    keep = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)   # open before the signal
    keep.request("GET", "/health")
    keep.getresponse().read()
    s.p.send_signal(signal.SIGINT)
    st, end = 0, time.time() + 10
    while st != 503 and time.time() < end:
        time.sleep(0.01)
        keep.request("GET", "/health")
        rr = keep.getresponse()
        st = rr.status
        rr.read()
    check(st == 503, f"shutdown: /health while draining: {st}")
    keep.request("POST", "/v1/completions", json.dumps({"prompt": "one", "max_tokens": 3}))
    rr = keep.getresponse()
    data = rr.read()
    check(rr.status == 503 and error_of(data), f"shutdown: a request while draining: {rr.status} {data[:200]}")
    try:
        s.http("GET", "/health", timeout=5)
        check(False, "shutdown: a new connection accepted while draining")
    except ConnectionRefusedError:
        pass
    t.join(60)
    r = res.get("r")
    check(r and r[0] == 200 and json.loads(r[2])["usage"]["completion_tokens"] == 4000,
          f"shutdown: the request in flight while draining: {r and (r[0], r[2][:200])}")
    rc, err = s.stop(timeout=60)
    check(rc == 0 and "signal 2" in err, f"shutdown (drain): exit {rc}: {err[-500:]}")


# ---------------------------------------------------------------- SmolLM2

def case_stream():
    s = Server(real_model(), "--ctx", "1024", "--max-batch", "4")
    c = s.client()
    try:
        msgs = [{"role": "user", "content": "Name three colours of the rainbow."}]
        for kind, kw in (("chat", {"messages": msgs}), ("completion", {"prompt": words(40)}),
                         ("stop", {"prompt": "1, 2, 3, 4, 5,", "stop": [" 9", "never"]}),
                         ("sampled", {"prompt": words(20, 50), "temperature": 0.9, "top_p": 0.9,
                                      "seed": 7}),
                         # characters of several bytes, split between tokens
                         ("utf8", {"prompt": "日本語の文章：東京は日本の首都です。大阪は", "stop": ["。"]})):
            create = c.chat.completions.create if kind == "chat" else c.completions.create
            args = dict(model="m", max_tokens=16, temperature=0)
            args.update(kw)
            whole = create(**args)
            ch = whole.choices[0]
            text = ch.message.content if kind == "chat" else ch.text
            check(ch.finish_reason in ("stop", "length") and whole.usage.completion_tokens >= 1,
                  f"{kind}: {whole}")
            if kind == "stop":
                check(" 9" not in text and ch.finish_reason == "stop" and text.startswith(" 6"),
                      f"stop string: {text!r} {ch.finish_reason}")
            if kind == "completion":
                check(ch.finish_reason == "length" and whole.usage.completion_tokens == 16,
                      f"completion: 16 tokens: {whole.usage}")
            parts, finish, usage, roles = [], None, None, []
            for chunk in create(stream=True, stream_options={"include_usage": True}, **args):
                if chunk.usage:
                    usage = chunk.usage
                for cc in chunk.choices:
                    if kind == "chat":
                        roles += [cc.delta.role] if cc.delta.role else []
                        parts.append(cc.delta.content or "")
                    else:
                        parts.append(cc.text)
                    finish = cc.finish_reason or finish
            check("".join(parts) == text, f"{kind}: streamed {''.join(parts)!r} != whole {text!r}")
            check(finish == ch.finish_reason, f"{kind}: streamed finish {finish} != {ch.finish_reason}")
            check(usage and usage.completion_tokens == whole.usage.completion_tokens and
                  usage.prompt_tokens == whole.usage.prompt_tokens, f"{kind}: stream usage {usage}")
            if kind == "chat":
                check(roles == ["assistant"], f"chat stream roles {roles}")
            print(f"{kind}: {text!r} ({len(parts)} chunks)")
        st, _, data = s.http("POST", "/v1/chat/completions", "{\"messages\": [")
        check(st == 400, f"malformed JSON on SmolLM2: {st}")
        s.wait_idle()
    finally:
        rc, err = s.stop()
    check(rc == 0, f"stream: exit {rc}: {err[-500:]}")


def case_concurrent():
    model = real_model()
    n_clients, distinct = 32, 8
    reqs = []
    for i in range(distinct):
        if i % 2:
            reqs.append(("chat", {"messages": [{"role": "user", "content": "Summarise: " + words(8 + 5 * i, 30 * i)}]}))
        else:
            reqs.append(("completion", {"prompt": words(5 + 8 * i, 30 * i)}))
    s = Server(model, "--ctx", "1024", "--max-batch", "8")
    c = s.client(timeout=300)

    def ask(k):
        kind, kw = reqs[k]
        args = dict(model="m", max_tokens=[8, 12, 10][k % 3], temperature=0, **kw)
        if kind == "chat":
            r = c.chat.completions.create(**args)
            return r.choices[0].message.content, r.usage.completion_tokens
        r = c.completions.create(**args)
        return r.choices[0].text, r.usage.completion_tokens

    try:
        alone = [ask(k) for k in range(distinct)]
        got = [None] * n_clients
        go = threading.Barrier(n_clients)

        def worker(i):
            go.wait()
            try:
                got[i] = ask(i % distinct)
            except Exception as e:   # noqa: BLE001 - reported below
                got[i] = repr(e)

        t0 = time.time()
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        el = time.time() - t0
        for i, g in enumerate(got):
            check(g == alone[i % distinct], f"client {i}: {g!r} != alone {alone[i % distinct]!r}")
        toks = sum(g[1] for g in got if isinstance(g, tuple))
        print(f"concurrent: {n_clients} clients, {toks} tokens in {el:.2f} s: "
              f"{n_clients / el:.2f} requests/s, {toks / el:.1f} generated tokens/s")
        s.wait_idle()
    finally:
        rc, err = s.stop()
    check(rc == 0, f"concurrent: exit {rc}: {err[-500:]}")
    # raw completions against hetkv run (greedy, same prompt and length)
    for k in range(0, distinct, 4):
        kind, kw = reqs[k]
        n = [8, 12, 10][k % 3]
        p = subprocess.run([hetkv, "run", "-m", model, "-p", kw["prompt"], "-n", str(n), "--temp", "0",
                            "--json", "-t", "2"], capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, f"hetkv run: {p.stderr[-300:]}")
        run_text = json.loads(p.stdout)["text"] if p.returncode == 0 else None
        check(run_text == alone[k][0], f"request {k}: serve {alone[k][0]!r} != hetkv run {run_text!r}")


def case_disconnect():
    s = Server(real_model(), "--ctx", "1024", "--max-batch", "4")
    body = {"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 900, "temperature": 0}
    try:
        # a stream read for a few events, then the socket closed
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
        data = json.dumps(dict(body, stream=True))
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n{data}".encode())
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        sock.close()
        # a whole-response request whose client gives up
        check(s.gives_up(body, 1.5), "disconnect: a 900-token request answered within 1.5 s")
        m = s.wait_idle(timeout=10)
        check(m.get("hetkv_requests_cancelled_total") == 2,
              f"disconnect: cancelled_total {m.get('hetkv_requests_cancelled_total')} != 2")
        check(m.get("hetkv_generation_tokens_total", 0) == 0,
              f"disconnect: cancelled requests counted as generated {m}")
        st, _, data = s.http("POST", "/v1/completions", dict(body, max_tokens=4))
        check(st == 200 and json.loads(data)["choices"][0]["text"].startswith(" 7"),
              f"disconnect: served after: {st} {data[:200]}")
        s.wait_idle()
    finally:
        rc, err = s.stop()
    check(rc == 0, f"disconnect: exit {rc}: {err[-500:]}")
    check("serve: http:" not in err, f"disconnect: libmicrohttpd messages for dropped clients: {err[-500:]}")


def case_policy():
    """Requests naming their own KV policy (the extension fields), side by side in one
    batch: each answer equals hetkv run under that policy; a policy that prepares the
    prompt, an unknown one and a bad argument are refused with 400."""
    model = real_model()
    near = ["--sink", "4", "--local", "16"]
    prompt = words(90, 7)
    cases = [(None, None, []),
             ("snapkv", {"budget": 16}, ["--policy", "snapkv", "--policy-arg", "budget=16"]),
             ("quest", {"budget": 16, "page": 4},
              ["--policy", "quest", "--policy-arg", "budget=16", "--policy-arg", "page=4"]),
             ("ctkvr", None, ["--policy", "ctkvr"])]
    s = Server(model, "--ctx", "512", "--max-batch", "4", *near)
    got = [None] * len(cases)
    try:
        def worker(i):
            pol, args, _ = cases[i]
            body = {"model": "m", "prompt": prompt, "max_tokens": 10, "temperature": 0}
            if pol:
                body["policy"] = pol
            if args:
                body["policy_args"] = args
            st, _, data = s.http("POST", "/v1/completions", body, timeout=300)
            got[i] = (st, json.loads(data)["choices"][0]["text"] if st == 200 else data)

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for body, what in (({"policy": "laq"}, "a policy that prepares the prompt"),
                           ({"policy": "nosuch"}, "an unknown policy"),
                           ({"policy": "snapkv", "policy_args": {"budget": -3}}, "a bad argument"),
                           ({"policy": "snapkv", "policy_args": {"nokey": 1}}, "an unknown key")):
            st, _, data = s.http("POST", "/v1/completions", dict(body, prompt="Hi", max_tokens=2))
            check(st == 400 and error_of(data), f"policy: {what}: {st} {data[:200]}")
        s.wait_idle()
    finally:
        rc, err = s.stop()
    check(rc == 0, f"policy: exit {rc}: {err[-500:]}")
    texts = set()
    for i, (pol, _, run_args) in enumerate(cases):
        p = subprocess.run([hetkv, "run", "-m", model, "-p", prompt, "-n", "10", "--temp", "0",
                            "--json", "-t", "2", "-c", "512", *near, *run_args],
                           capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, f"hetkv run {run_args}: {p.stderr[-300:]}")
        run_text = json.loads(p.stdout)["text"] if p.returncode == 0 else None
        check(got[i] is not None and got[i][0] == 200 and got[i][1] == run_text,
              f"policy {pol}: serve {got[i]!r} != hetkv run {run_text!r}")
        texts.add(run_text)
    print(f"policy: {len(cases)} policies in one batch, {len(texts)} distinct answers")


def case_prefix():
    """The prefix cache behind the server, under ctkvr: three questions over one document,
    one after another; the later ones start from the kept prefix and take its index by
    reference, which /metrics counts."""
    model = real_model()
    doc = words(300, 3)
    s = Server(model, "--ctx", "1024", "--max-batch", "2", "--chunk", "64", "--prefix-cache", "2",
               "--policy", "ctkvr", "--sink", "4", "--local", "32")
    answers = []
    try:
        for i in range(3):
            # the questions differ in their last token only: the kept prefix
            # reaches the request's last whole chunk whatever the document's
            # length (README.md's words: any edit moves it), so the index is
            # always taken by reference
            body = {"model": "m", "prompt": doc + f"\n\nWhat does it say? Question {i + 1}",
                    "max_tokens": 6, "temperature": 0}
            st, _, data = s.http("POST", "/v1/completions", body, timeout=300)
            check(st == 200, f"prefix: request {i}: {st} {data[:200]}")
            answers.append(json.loads(data)["choices"][0]["text"] if st == 200 else None)
        m = s.metrics()
        check(m.get("hetkv_prefix_cache_hits_total", 0) >= 2 and
              m.get("hetkv_prefix_cache_tokens_total", 0) >= 2 * 64 and
              m.get("hetkv_prefix_cache_index_hits_total", 0) >= 1 and
              m.get("hetkv_prefix_cache_bytes", 0) > 0,
              f"prefix: metrics {({k: v for k, v in m.items() if 'prefix' in k})}")
    finally:
        rc, err = s.stop()
    check(rc == 0 and all(a is not None for a in answers), f"prefix: exit {rc}: {err[-500:]}")
    print(f"prefix: 3 questions, {len(set(answers))} distinct answers")


CASES = {"protocol": case_protocol, "queue": case_queue, "shutdown": case_shutdown,
         "stream": case_stream, "concurrent": case_concurrent, "disconnect": case_disconnect,
         "policy": case_policy, "prefix": case_prefix}
t_start = time.time()
CASES[case]()
print(f"{case}: {time.time() - t_start:.1f} s, {len(failures)} failures")
sys.exit(1 if failures else 0)
