"""Remote sources end to end, against real servers on loopback: nginx (an
HTTP server with byte ranges), moto (S3: signed requests checked by moto,
listings, unsigned access, credentials from the ~/.aws files) and
server.py (every failure mode). Through the fst command and the Python
package; bytes equal to the local files on every path, onto the CPU and
onto the libcuda double."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file as ref_load_file

from conftest import FAKE_KEY, FAKE_SECRET, run_fst

import fsttest


def reference(path):
    """name -> bytes of every tensor of a local file or folder."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    out = {}
    for f in files:
        h, blob = fsttest.Header(f), fsttest.file_bytes(f)
        for name, info in h.tensors.items():
            b, e = info["data_offsets"]
            out[name] = blob[h.data_offset + b:h.data_offset + e]
    return out


def inspect_json(target, env=None, *extra):
    r = run_fst("inspect", "--json", *extra, target, env=env)
    assert r.returncode == 0, r.stderr
    return [{k: v for k, v in f.items() if k != "path"} for f in json.loads(r.stdout)]


def assert_package_bytes(url, local, **kw):
    import fst
    got = fst.load(url, framework="numpy", **kw)
    want = reference(local)
    assert sorted(got) == sorted(want)
    for name, arr in got.items():
        assert arr.tobytes() == want[name], name


# ------------------------------------------------------------------- nginx

def test_nginx_inspect_load_verify(nginx, root, fst_env):
    env = fst_env()
    for url, local in ((f"{nginx}/ck/model.safetensors.index.json", root / "ck"),
                       (f"{nginx}/one/model.safetensors", root / "one" / "model.safetensors")):
        assert inspect_json(url, env) == inspect_json(str(local), env)
        r = run_fst("verify", url, env=env)
        assert r.returncode == 0, r.stderr
        assert "byte-identical" in r.stdout and "remote (ranged GETs)" in r.stdout
        r = run_fst("load", "--json", "--threads", "4", "--chunk", "1MiB", url, env=env)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert "remote (ranged GETs), 4 threads, 1 MiB chunks" in out["path_chosen"]
    r = run_fst("verify", "--hash", f"{nginx}/one/model.safetensors", env=env)
    import hashlib
    digest = hashlib.sha256((root / "one" / "model.safetensors").read_bytes()).hexdigest()
    assert r.returncode == 0 and f"sha256 {digest} " in r.stdout, r.stdout + r.stderr


def test_nginx_python_package(nginx, root):
    import fst
    assert_package_bytes(f"{nginx}/ck/model.safetensors.index.json", root / "ck")
    want = reference(root / "one" / "model.safetensors")
    got = {n: t.tobytes() for n, t in fst.iter_tensors(f"{nginx}/one/model.safetensors",
                                                         framework="numpy", threads=3)}
    assert got == want
    got = fst.load_file(f"{nginx}/one/model.safetensors", framework="numpy")
    assert {n: a.tobytes() for n, a in got.items()} == want
    with fst.safe_open(f"{nginx}/one/model.safetensors", framework="numpy") as f:
        assert {n: f.get_tensor(n).tobytes() for n in f.keys()} == want
    ck = fst.Checkpoint(f"{nginx}/ck/model.safetensors.index.json")
    assert sorted(ck.keys()) == sorted(reference(root / "ck"))


def test_nginx_refusals(nginx, fst_env):
    env = fst_env()
    r = run_fst("load", f"{nginx}/ck/", env=env)
    assert r.returncode == 1 and "only S3 folders" in r.stderr, r.stderr
    r = run_fst("load", "--io", "mmap", f"{nginx}/one/model.safetensors", env=env)
    assert r.returncode == 1 and "io=mmap reads local files" in r.stderr, r.stderr
    r = run_fst("inspect", f"{nginx}/ck/nope.safetensors", env=env)
    assert r.returncode == 4 and "HTTP 404 Not Found" in r.stderr, r.stderr


def test_cuda_double(nginx, root, tmp_path):
    """Onto cuda:0 through the libcuda double, in a fresh process (the
    driver is loaded once per process)."""
    double = os.environ.get("FST_CUDA_DOUBLE") or str(fsttest.FST_BIN.parent / "tests" /
                                                      "libfst_cuda_double.so")
    if not os.path.isfile(double):
        pytest.skip(f"CUDA test double not built at {double}")
    want = tmp_path / "want.json"
    want.write_text(json.dumps({k: v.hex() for k, v in reference(root / "ck").items()}))
    code = f"""
import json, fst
want = json.load(open({str(want)!r}))
buf = fst._fst.load(fst.Checkpoint({nginx + '/ck/model.safetensors.index.json'!r})._ck,
                    device="cuda:0", threads=3)
assert "remote (ranged GETs)" in buf.describe(), buf.describe()
for name, hexbytes in want.items():
    t = buf.tensor(name)
    assert t.device == "cuda:0" and t.data_ptr % 256 == 0
    assert t.tobytes().hex() == hexbytes, name
print("ok")
"""
    env = dict(os.environ, FST_CUDA_LIBRARY=double)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
    r = run_fst("verify", "--device", "cuda:0", f"{nginx}/ck/model.safetensors.index.json",
                env=env)
    assert r.returncode == 0, r.stderr


# -------------------------------------------------------------------- moto

def test_moto_signed_checked_by_moto(moto, root, fst_env):
    """moto checks every signature (reset-auth), with botocore's code."""
    moto.auth(True)
    try:
        env = fst_env(**moto.env())
        for url in ("s3://models/llm/model.safetensors.index.json", "s3://models/one/model.safetensors"):
            r = run_fst("verify", url, env=env)
            assert r.returncode == 0, r.stderr
        r = run_fst("inspect", "s3://models/llm/model.safetensors.index.json",
                    env=fst_env(**moto.env(AWS_SECRET_ACCESS_KEY="wrong")))
        assert r.returncode == 4 and "HTTP 403 Forbidden (SignatureDoesNotMatch" in r.stderr, r.stderr
        r = run_fst("inspect", "s3://models/one/absent.safetensors", env=env)
        assert r.returncode == 4 and "HTTP 404 Not Found (NoSuchKey" in r.stderr, r.stderr
        # credentials from ~/.aws/credentials, the profile by name
        e = fst_env(AWS_ENDPOINT_URL=moto.url, AWS_PROFILE="ci")
        os.makedirs(os.path.join(e["HOME"], ".aws"))
        with open(os.path.join(e["HOME"], ".aws", "credentials"), "w") as f:
            f.write(f"[ci]\naws_access_key_id = {moto.key}\naws_secret_access_key = {moto.secret}\n")
        r = run_fst("load", "s3://models/one/model.safetensors", env=e)
        assert r.returncode == 0, r.stderr
        r = run_fst("load", "--profile", "absent", "s3://models/one/model.safetensors", env=e)
        assert r.returncode == 1 and 'AWS profile "absent" is in neither' in r.stderr, r.stderr
        # the endpoint as an option of the Python package, credentials from
        # the environment of this process
        import fst
        saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        os.environ.update(AWS_ACCESS_KEY_ID=moto.key, AWS_SECRET_ACCESS_KEY=moto.secret)
        try:
            assert_package_bytes("s3://models/llm/model.safetensors.index.json", root / "ck",
                                 endpoint=moto.url)
            with pytest.raises(FileNotFoundError):
                fst.Checkpoint("s3://models/llm/absent.safetensors", endpoint=moto.url)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        moto.auth(False)


def test_moto_key_with_dot_segments_is_its_own(moto, fst_env):
    """"sub/../one/model.safetensors" is an S3 key of its own: fst asks for
    it as written (signed and unsigned), not for "one/model.safetensors"
    (a valid checkpoint there), so the key's own bytes, not a checkpoint,
    fail as not safetensors."""
    import boto3
    s3 = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1",
                      aws_access_key_id=moto.key, aws_secret_access_key=moto.secret)
    s3.put_object(Bucket="models", Key="sub/../one/model.safetensors", Body=b"\x05" * 64)
    for env in (fst_env(**moto.env()), fst_env(AWS_ENDPOINT_URL=moto.url,
                                               AWS_NO_SIGN_REQUEST="1")):
        r = run_fst("inspect", "s3://models/sub/../one/model.safetensors", env=env)
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        assert "s3://models/sub/../one/model.safetensors" in r.stderr, r.stderr
        r = run_fst("inspect", "s3://models/one/model.safetensors", env=env)
        assert r.returncode == 0, r.stderr


def test_moto_listing_and_unsigned(moto, root, fst_env):
    """A folder is listed (ListObjectsV2): its index decides, the subfolder's
    object is not the folder's. moto's own check of a listing's signature
    refuses boto3's too (a '/' in the query), so listings run with moto's
    checks off; their signatures are checked against botocore's below."""
    env = fst_env(**moto.env())
    want = inspect_json(str(root / "ck"), env)
    assert inspect_json("s3://models/llm/", env) == want
    r = run_fst("verify", "s3://models/llm/", env=env)
    assert r.returncode == 0, r.stderr
    # unsigned: asked for, or by AWS_NO_SIGN_REQUEST, or without credentials
    for e, extra in ((fst_env(AWS_ENDPOINT_URL=moto.url, AWS_NO_SIGN_REQUEST="1"), []),
                     (fst_env(AWS_ENDPOINT_URL=moto.url), []),
                     (env, ["--no-sign-request"])):
        assert inspect_json("s3://models/llm/", e, *extra) == want
    r = run_fst("inspect", "s3://models/empty/", env=env)
    assert r.returncode == 2 and "holds no *.safetensors files" in r.stderr, r.stderr
    r = run_fst("inspect", "--endpoint", moto.url, "s3://models/one/model.safetensors",
                env=fst_env(AWS_NO_SIGN_REQUEST="1"))
    assert r.returncode == 0, r.stderr


def test_signatures_match_botocore(fault, root, fst_env):
    """Every signed request (object GETs, the listing, with a session
    token, a key with dot segments) carries the signature botocore computes
    for it."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    base, log = fault
    env = fst_env(AWS_ACCESS_KEY_ID=FAKE_KEY, AWS_SECRET_ACCESS_KEY=FAKE_SECRET,
                  AWS_SESSION_TOKEN="tok/en+=", AWS_REGION="eu-west-1", AWS_ENDPOINT_URL=base)
    start = len(log.read_text().splitlines()) if log.exists() else 0
    # the bucket "signed" is server.py's mode ok: /signed/ck/... serves ck/
    r = run_fst("verify", "s3://signed/ck/model.safetensors.index.json", env=env)
    assert r.returncode == 0, r.stderr
    r = run_fst("inspect", "s3://signed/ck/", env=env)  # server.py cannot list: its 404 is fine
    assert r.returncode == 4
    # a key with dot segments is signed as sent, the segments kept
    run_fst("inspect", "s3://signed/sub/../one/model.safetensors", env=env)
    lines = [json.loads(x) for x in log.read_text().splitlines()[start:]]
    signed = [x for x in lines if "Authorization" in x["headers"]]
    assert len(signed) >= 5 and any("list-type=2" in x["path"] for x in signed)
    assert any(x["path"].startswith("/signed/sub/../one/") for x in signed), lines
    # the empty body's hash: what a libcurl before 7.87 signs, whatever the header says
    import hashlib
    empty = hashlib.sha256(b"").hexdigest()
    assert all(x["headers"]["x-amz-content-sha256"] == empty for x in signed), signed[0]
    creds = Credentials(FAKE_KEY, FAKE_SECRET, "tok/en+=")
    for x in signed:
        h = x["headers"]
        auth = h["Authorization"]
        names = auth.partition("SignedHeaders=")[2].partition(",")[0].split(";")
        assert "x-amz-security-token" in names and "x-amz-content-sha256" in names
        assert "/eu-west-1/s3/aws4_request" in auth
        req = AWSRequest(method="GET", url=base + x["path"],
                         headers={k: v for k, v in h.items() if k.lower() in names})
        req.context["timestamp"] = h["X-Amz-Date"]
        a = S3SigV4Auth(creds, "s3", "eu-west-1")
        want = a.signature(a.string_to_sign(req, a.canonical_request(req)), req)
        assert auth.endswith("Signature=" + want), (x["path"], auth)
    # every ranged GET after the header's says which object it wants
    data = [x for x in signed if "Range" in x["headers"] and "bytes=0-" not in x["headers"]["Range"]]
    assert data and all(x["headers"].get("If-Match", "").startswith('"') for x in data)


def test_signed_requests_stay_where_they_were_sent(fault, fst_env):
    """A signed request is not followed to a redirect's other host: libcurl
    would drop the Authorization header there, not the session token. A
    session token longer than any buffer goes whole."""
    base, log = fault
    token = "T" * 5000
    env = fst_env(AWS_ACCESS_KEY_ID=FAKE_KEY, AWS_SECRET_ACCESS_KEY=FAKE_SECRET,
                  AWS_SESSION_TOKEN=token, AWS_REGION="eu-west-1", AWS_ENDPOINT_URL=base)
    start = len(log.read_text().splitlines()) if log.exists() else 0
    r = run_fst("inspect", "s3://elsewhere/one/model.safetensors", env=env)
    assert r.returncode == 4, r.stderr
    assert "HTTP 302" in r.stderr and "does not follow redirects" in r.stderr, r.stderr
    r = run_fst("verify", "s3://signed/one/model.safetensors", env=env)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in log.read_text().splitlines()[start:]]
    assert [x["path"] for x in lines if x["path"].startswith("/elsewhere/")]
    assert not [x for x in lines if x["path"].startswith("/ok/")], lines
    signed = [x for x in lines if x["path"].startswith("/signed/")]
    assert signed and all(x["headers"]["x-amz-security-token"] == token for x in signed)


def test_cancel_and_progress_reach_a_loader_in_finish(fault):
    """finish() waits with the loader still in reach: another thread's
    progress() sees the bytes come, and its cancel() ends the wait
    (CancelledError) long before the slow server would have."""
    import threading
    import fst
    base, _ = fault
    ck = fst._fst.Checkpoint(f"{base}/slow/one/model.safetensors")
    loader = fst._fst.start(ck, threads=1, chunk_bytes=1 << 20)
    _, total = loader.progress()
    out = {}

    def finish():
        t0 = time.time()
        try:
            loader.finish()
            out["result"] = "finished"
        except fst.CancelledError:
            out["result"] = "cancelled"
        out["secs"] = time.time() - t0

    th = threading.Thread(target=finish)
    th.start()
    seen, t0 = [], time.time()
    while time.time() - t0 < 20 and (not seen or seen[-1] < 2 << 20):
        seen.append(loader.progress()[0])
        time.sleep(0.02)
    loader.cancel()
    th.join(30)
    assert not th.is_alive()
    assert 2 << 20 <= seen[-1] < total, (seen[-1], total)
    assert out["result"] == "cancelled", out
    with pytest.raises(RuntimeError, match="loader already finished"):
        loader.next()


def test_https_never_redirects_to_http(tls_fault, fst_env):
    """Over https, a redirect to plain http (where anyone between could
    change the bytes) fails; https itself, and redirects within it, work."""
    base, cert, _ = tls_fault
    env = fst_env(CURL_CA_BUNDLE=str(cert))
    for mode in ("ok", "redirect"):
        r = run_fst("verify", f"{base}/{mode}/one/model.safetensors", env=env)
        assert r.returncode == 0, r.stderr
    r = run_fst("load", f"{base}/downgrade/one/model.safetensors", env=env)
    assert r.returncode == 4 and f"{base}/downgrade/one/" in r.stderr, r.stderr
    assert "libcurl error 1)" in r.stderr, r.stderr  # CURLE_UNSUPPORTED_PROTOCOL


@pytest.mark.parametrize("masks", [True, False], ids=["bit-masks", "no-protocol-options"])
def test_https_never_redirects_to_http_on_an_older_libcurl(tls_fault, fst_env, masks):
    """A libcurl older than 7.85 has no CURLOPT_*PROTOCOLS_STR: fst sets the
    bit-mask forms instead, so a redirect from https to http still fails;
    with neither, no redirect is followed at all (its libcurl default
    would follow https down to http)."""
    double = os.environ.get("FST_CURL_DOUBLE")
    if not double:
        pytest.skip("FST_CURL_DOUBLE unset (ctest sets it)")
    base, cert, _ = tls_fault
    env = fst_env(CURL_CA_BUNDLE=str(cert), FST_CURL_LIBRARY=double, CURL_DOUBLE_OLD="1",
                  CURL_DOUBLE_NO_MASKS="0" if masks else "1")
    r = run_fst("verify", f"{base}/ok/one/model.safetensors", env=env)
    assert r.returncode == 0, r.stderr
    r = run_fst("verify", f"{base}/redirect/one/model.safetensors", env=env)
    if masks:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 4 and "HTTP 30" in r.stderr, r.stderr
    r = run_fst("load", f"{base}/downgrade/one/model.safetensors", env=env)
    assert r.returncode == 4 and f"{base}/downgrade/one/" in r.stderr, r.stderr
    if masks:
        assert "libcurl error 1)" in r.stderr, r.stderr  # CURLE_UNSUPPORTED_PROTOCOL
    else:
        assert "HTTP 30" in r.stderr, r.stderr


def test_tls_handshakes_reset_are_retried(tls_fault, fst_env):
    """A connection reset during the TLS handshake (S3 under load) is
    retried like any dropped connection."""
    _, cert, flaky = tls_fault
    r = run_fst("verify", f"{flaky}/ok/one/model.safetensors", env=fst_env(CURL_CA_BUNDLE=str(cert)))
    assert r.returncode == 0, r.stderr


def test_url_secrets_are_not_shown(fault, root, fst_env):
    """A password in the URL and a query (a presigned URL's signature) never
    show in messages, logs or the names fst reports; an index's query is
    its own, not its shards'."""
    base, log = fault
    host = base.partition("://")[2]
    env = fst_env(FST_LOG="debug")
    start = len(log.read_text().splitlines()) if log.exists() else 0
    url = f"http://alice:hunter2@{host}/ok/ck/model.safetensors.index.json?X-Amz-Signature=s3cr3t/x"
    r = run_fst("verify", url, env=env)
    assert r.returncode == 0, r.stderr
    r2 = run_fst("inspect", "--json", url, env=env)
    assert r2.returncode == 0, r2.stderr
    bad = f"http://alice:hunter2@{host}/missing/one/model.safetensors?sig=s3cr3t"
    r3 = run_fst("load", bad, env=env)
    assert r3.returncode == 4 and "HTTP 404" in r3.stderr, r3.stderr
    # a failed input of inspect --json is named as fst names it
    r4 = run_fst("inspect", "--json", bad, env=env)
    assert r4.returncode == 4, r4.stderr
    failed = json.loads(r4.stdout)
    assert failed[0]["ok"] is False, failed
    assert failed[0]["path"] == f"http://alice:***@{host}/missing/one/model.safetensors?***", failed
    for out in (r.stdout, r.stderr, r2.stdout, r2.stderr, r3.stdout, r3.stderr, r4.stdout,
                r4.stderr):
        assert "hunter2" not in out and "s3cr3t" not in out, out
    assert f"http://alice:***@{host}/missing/one/model.safetensors?***" in r3.stderr, r3.stderr
    shown = json.loads(r2.stdout)
    assert all(f"alice:***@{host}/ok/ck/" in f["path"] for f in shown), shown
    lines = [json.loads(x) for x in log.read_text().splitlines()[start:]]
    shards = [x["path"] for x in lines if x["path"].startswith("/ok/ck/model-")]
    assert shards and not [p for p in shards if "?" in p], shards
    assert [x for x in lines if x["path"].endswith("?X-Amz-Signature=s3cr3t/x")]
    import fst
    good = f"http://alice:hunter2@{host}/ok/one/model.safetensors?sig=s3cr3t"
    for call in (lambda: fst.load(good, framework="numpy", names=["typo"]),
                 lambda: dict(fst.iter_tensors(good, framework="numpy", names=["typo"]))):
        with pytest.raises(fst.UsageError) as e:
            call()
        assert "hunter2" not in str(e.value) and "s3cr3t" not in str(e.value), str(e.value)
        assert f"alice:***@{host}" in str(e.value), str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        fst.load(bad, framework="numpy")
    assert "hunter2" not in repr(e.value) and "s3cr3t" not in repr(e.value), repr(e.value)
    assert "hunter2" not in str(e.value) and "s3cr3t" not in str(e.value)


def test_secrets_stay_out_of_debug_logs_and_bench(fault, root, fst_env):
    """Errors logged at debug as they are made, before the message is
    hidden (an http folder, an index that is not JSON), and fst bench's
    report, text and JSON: no password or query shows. A password with a
    '/', '#' or '?' not percent-encoded is a usage error that hides it."""
    base, _ = fault
    host = base.partition("://")[2]
    bad = root / "notjson"
    bad.mkdir(exist_ok=True)
    (bad / "model.safetensors.index.json").write_text("{not json")
    (bad / "model.safetensors.index.json").chmod(0o644)
    bad.chmod(0o755)
    env = fst_env(FST_LOG="debug")
    auth = f"http://alice:hunter2@{host}"
    runs = []
    r = run_fst("inspect", f"{auth}/ok/one/?X-Amz-Signature=s3cr3t", env=env)
    assert r.returncode == 1 and "only S3 folders" in r.stderr, r.stderr
    assert "fst: debug: " in r.stderr, r.stderr  # the error was logged
    runs.append(r)
    r = run_fst("inspect", f"{auth}/ok/notjson/model.safetensors.index.json?sig=s3cr3t", env=env)
    assert r.returncode == 2 and "not valid JSON" in r.stderr, r.stderr
    runs.append(r)
    one = f"{auth}/ok/one/model.safetensors?sig=s3cr3t"
    r = run_fst("bench", one, "--runs", "1", env=env)
    assert r.returncode == 0 and f"bench http://alice:***@{host}/ok/one/" in r.stdout, r.stdout
    runs.append(r)
    r = run_fst("bench", one, "--runs", "1", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"] == \
        f"http://alice:***@{host}/ok/one/model.safetensors?***", r.stdout
    runs.append(r)
    for pw in ("hun/ter2", "hun#ter2", "hun?ter2"):
        r = run_fst("load", f"http://alice:{pw}@{host}/ok/one/model.safetensors", env=env)
        assert r.returncode == 1 and "not a URL libcurl can request" in r.stderr, r.stderr
        assert f"http://alice:***@{host}/ok/one/model.safetensors" in r.stderr, r.stderr
        assert "ter2" not in r.stderr and "ter2" not in r.stdout, r.stderr
    for r in runs:
        for out in (r.stdout, r.stderr):
            assert "hunter2" not in out and "s3cr3t" not in out, out


def test_an_s3_listing_that_loops_fails(fault, fst_env):
    """A listing whose continuation tokens come round again (a server's bug)
    fails at the first repeat, naming it, where it was fetched and kept page
    after page up to 10000 pages."""
    base, log = fault
    start = len(log.read_text().splitlines()) if log.exists() else 0
    env = fst_env(AWS_NO_SIGN_REQUEST="1")
    r = run_fst("inspect", "--endpoint", base, "s3://listloop/p/", env=env, timeout=60)
    assert r.returncode == 4, r.stderr
    assert "s3://listloop/p/: page 3 of the listing hands back the continuation token that " \
        "asked for page 2: the server's listing goes round in a loop" in r.stderr, r.stderr
    asked = [json.loads(x)["path"] for x in log.read_text().splitlines()[start:]]
    assert len([p for p in asked if p.startswith("/listloop?")]) == 3, asked


def test_endpoint_and_token_secrets_are_not_shown(fault, fst_env):
    """An S3 endpoint's password, and a token given as a URL's user (no
    ':'), never show: not in the error naming the endpoint a request was
    sent to, not in the debug log."""
    base, _ = fault
    host = base.partition("://")[2]
    env = fst_env(FST_LOG="debug", AWS_NO_SIGN_REQUEST="1")
    endpoint = f"http://bob:endpo1ntpw@{host}"
    r = run_fst("inspect", "--endpoint", endpoint, "s3://signed/one/model.safetensors", env=env)
    assert r.returncode == 0, r.stderr
    assert f", at http://bob:***@{host}/signed/one/model.safetensors" in r.stderr, r.stderr
    r2 = run_fst("load", "--endpoint", endpoint, "s3://missing/one/model.safetensors", env=env)
    assert r2.returncode == 4, r2.stderr
    assert f"HTTP 404 Not Found (NoSuchKey" in r2.stderr, r2.stderr
    assert f"from http://bob:***@{host}/missing/one/model.safetensors" in r2.stderr, r2.stderr
    r4 = run_fst("verify", f"http://T0KEN-of-alice@{host}/ok/one/model.safetensors", env=env)
    assert r4.returncode == 0, r4.stderr
    r5 = run_fst("load", f"http://T0KEN-of-alice@{host}/missing/one/model.safetensors",
                 env=env)
    assert r5.returncode == 4 and f"http://***@{host}/missing/one/" in r5.stderr, r5.stderr
    for out in (r.stdout, r.stderr, r2.stdout, r2.stderr, r4.stdout, r4.stderr, r5.stderr):
        assert "endpo1ntpw" not in out and "T0KEN" not in out, out


# ------------------------------------------------------------ failure modes

FAILURES = [
    # mode, exit code, words of the message (None: success, bytes verified)
    ("flaky", 0, None),
    ("reset", 0, None),
    ("capped", 0, None),
    ("trailer", 0, None),
    ("wholeok", 0, None),
    ("trickle", 4, "fewer than the 65536 an answer must bring"),
    ("redirect", 0, None),
    ("elsewhere", 0, None),
    ("longetag", 0, None),
    ("always500", 4, "HTTP 503 Service Unavailable (SlowDown"),
    ("short", 4, "libcurl error 18"),
    ("changed", 8, "object changed during the load (HTTP 412"),
    ("changed-noetag-check", 8, "object changed during the load (its ETag was"),
    ("forbidden", 4, "HTTP 403 Forbidden (AccessDenied"),
    ("missing", 4, "HTTP 404 Not Found (NoSuchKey"),
    ("norange", 7, "the server ignored the Range request"),
    ("loop", 4, "more than 5 redirects"),
    ("nocr", 4, "HTTP 206 without a Content-Range"),
]


@pytest.mark.parametrize("mode,code,words", FAILURES, ids=[f[0] for f in FAILURES])
def test_failure_modes(fault, fst_env, mode, code, words):
    base, _ = fault
    import urllib.request
    urllib.request.urlopen(base + "/reset").read()
    url = f"{base}/{mode}/ck/model.safetensors.index.json"
    t0 = time.time()
    r = run_fst("verify" if code == 0 else "load", url, env=fst_env(), timeout=120)
    secs = time.time() - t0
    assert r.returncode == code, (r.returncode, r.stderr)
    if words:
        assert words in r.stderr and f"{base}/{mode}/ck/" in r.stderr, r.stderr
        # bounded: 5 retries with backoff capped at 5 s each, never a hang
        assert secs < 40, secs
    else:
        assert "byte-identical" in r.stdout


def test_package_errors(fault):
    import fst
    base, _ = fault
    with pytest.raises(FileNotFoundError):
        fst.load(f"{base}/missing/one/model.safetensors", framework="numpy")
    with pytest.raises(PermissionError):
        fst.load(f"{base}/forbidden/one/model.safetensors", framework="numpy")
    import urllib.request
    urllib.request.urlopen(base + "/reset").read()
    with pytest.raises(fst.FileChangedError):
        fst.load(f"{base}/changed/one/model.safetensors", framework="numpy")
    with pytest.raises(fst.UnsupportedError):
        fst.Checkpoint(f"{base}/norange/one/model.safetensors")
    with pytest.raises(fst.UsageError):
        fst.Checkpoint("s3://models/x.safetensors", endpoint="ftp://nowhere")


def test_without_libcurl(fault, root, fst_env):
    base, _ = fault
    env = fst_env(FST_CURL_LIBRARY="/nonexistent/libcurl.so.4")
    r = run_fst("inspect", f"{base}/ok/one/model.safetensors", env=env)
    assert r.returncode == 7, r.stderr
    assert "libcurl" in r.stderr and "/nonexistent/libcurl.so.4" in r.stderr, r.stderr
    r = run_fst("load", str(root / "one" / "model.safetensors"), env=env)
    assert r.returncode == 0, r.stderr
