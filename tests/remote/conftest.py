"""The remote tests' servers, each started on a loopback port of its own and
stopped at the end of the session (servers.py): nginx (Debian's, run as this
user with a config of its own, never the packaged service), moto's S3 server,
and the fault-injecting server of server.py. A test whose server is not installed
skips saying so; scripts/install-deps.sh installs them all, so CI runs
every test. The checkpoints are written by `fst gen`."""
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))

import fsttest  # noqa: E402
from servers import free_port, nginx_path, start_fault_server, start_nginx, stop, wait_http  # noqa: E402

FAKE_KEY, FAKE_SECRET = "AKIAFAKEFAKEFAKE", "fake-secret"


@pytest.fixture(autouse=True, scope="session")
def _require_fst_bin():
    if not fsttest.fst_bin_ok():
        pytest.skip(f"fst command not found at {fsttest.FST_BIN} (build it with `make`)")


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    """The served folder: ck/ (3 shards and an index, misaligned tensors)
    and one/model.safetensors."""
    d = tmp_path_factory.mktemp("served")
    for name, args in (("ck", ["--shards", "3", "--misaligned"]), ("one", ["--shards", "1"])):
        r = fsttest.fst("gen", str(d / name), "--size", "12MiB", "--seed", "7", *args)
        assert r.returncode == 0, r.stderr
    one = list((d / "one").glob("*.safetensors"))
    assert len(one) == 1
    one[0].rename(d / "one" / "model.safetensors")
    # the served tree must be readable by nginx's workers
    for p in [d, *d.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return d


@pytest.fixture(scope="session")
def fault(root, tmp_path_factory):
    """(base URL, request log) of server.py serving root."""
    log = tmp_path_factory.mktemp("fault") / "requests.jsonl"
    url, proc = start_fault_server(root, log)
    yield url, log
    stop(proc)


@pytest.fixture(scope="session")
def tls_fault(root, fault, tmp_path_factory):
    """(https base URL, its certificate) of server.py over TLS, whose mode
    downgrade redirects to the plain server of `fault`."""
    openssl = shutil.which("openssl")
    if not openssl:
        pytest.skip("openssl is not installed (scripts/install-deps.sh installs it)")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    r = subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    url, proc = start_fault_server(root, None, tls=(cert, key), downgrade_to=fault[0])
    # and one whose first handshakes are reset
    flaky, flaky_proc = start_fault_server(root, None, tls=(cert, key), tls_drop=2)
    yield url, cert, flaky
    stop(proc)
    stop(flaky_proc)


@pytest.fixture(scope="session")
def nginx(root, tmp_path_factory):
    """Base URL of nginx serving root."""
    if not nginx_path():
        pytest.skip("nginx is not installed (scripts/install-deps.sh installs Debian's nginx)")
    try:
        url, proc = start_nginx(root, tmp_path_factory.mktemp("nginx"))
    except RuntimeError as e:
        pytest.fail(str(e))
    yield url
    stop(proc)


class Moto:
    """moto's S3 server: the bucket "models" holds llm/ (the sharded
    checkpoint) and one/model.safetensors; key and secret are an IAM user's,
    allowed s3:*. auth(True) makes moto check every request's signature."""

    def __init__(self, url, key, secret):
        self.url, self.key, self.secret = url, key, secret

    def auth(self, on):
        urllib.request.urlopen(urllib.request.Request(
            self.url + "/moto-api/reset-auth", data=b"0" if on else b"inf",
            headers={"Content-Type": "text/plain"}, method="POST")).read()

    def env(self, **extra):
        e = {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret,
             "AWS_ENDPOINT_URL": self.url, "AWS_REGION": "us-east-1"}
        e.update(extra)
        return {k: v for k, v in e.items() if v is not None}


@pytest.fixture(scope="session")
def moto(root):
    try:
        import boto3
        import moto.server  # noqa: F401
    except ImportError as e:
        pytest.skip(f"moto[server] is not installed ({e}; scripts/install-deps.sh installs it)")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/moto-api/", proc)
    kw = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
              aws_secret_access_key="test")
    iam = boto3.client("iam", **kw)
    iam.create_user(UserName="fst")
    k = iam.create_access_key(UserName="fst")["AccessKey"]
    iam.put_user_policy(UserName="fst", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    s3 = boto3.client("s3", **kw)
    s3.create_bucket(Bucket="models")
    # a public bucket: anyone may read (unsigned requests)
    s3.put_bucket_policy(Bucket="models", Policy=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"],
                        "Resource": ["arn:aws:s3:::models", "arn:aws:s3:::models/*"]}]}))
    for f in sorted((root / "ck").iterdir()):
        s3.upload_file(str(f), "models", "llm/" + f.name)
    s3.upload_file(str(root / "one" / "model.safetensors"), "models", "one/model.safetensors")
    # a file in a subfolder: not the folder's own
    s3.put_object(Bucket="models", Key="llm/old/stale.safetensors", Body=b"not loaded")
    m = Moto(url, k["AccessKeyId"], k["SecretAccessKey"])
    yield m
    stop(proc)


@pytest.fixture
def fst_env():
    """fst_env(**vars) -> an environment for the fst command: this one
    without any AWS variable, HOME a folder without ~/.aws, plus vars."""
    home = None

    def make(**extra):
        nonlocal home
        import tempfile
        home = home or tempfile.mkdtemp()
        e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        e.pop("FST_CURL_LIBRARY", None)
        e["HOME"] = home
        e.update(extra)
        return e

    yield make
    if home:
        shutil.rmtree(home, ignore_errors=True)


def run_fst(*args, env=None, timeout=300):
    return subprocess.run([str(fsttest.FST_BIN), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout)
