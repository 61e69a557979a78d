"""Starting and stopping the remote tests' and benchmarks' servers on
loopback: nginx run as this user with a config of its own (Debian's
packaged service is never used), and server.py."""
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, proc, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no answer from {url} in {timeout} s")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def nginx_path():
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                     else None)


def start_nginx(root, prefix, workers=2):
    """nginx serving the folder root, its files under prefix: (base URL,
    process). Raises RuntimeError when it does not start."""
    exe = nginx_path()
    prefix = Path(prefix)
    port = free_port()
    user = f"user {os.environ.get('USER', 'root')};" if os.geteuid() == 0 else ""
    conf = prefix / "nginx.conf"
    conf.write_text(f"""
{user}
worker_processes {workers};
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    sendfile on;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
}}
""")
    proc = subprocess.Popen([exe, "-p", str(prefix), "-c", str(conf)], stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/", proc)
    except RuntimeError as e:
        stop(proc)
        raise RuntimeError(f"nginx did not start: {e}: {proc.stderr.read().decode()[-2000:]}")
    return url, proc


def start_fault_server(root, log=None, tls=None, downgrade_to=None, tls_drop=0):
    """server.py serving root: (base URL, process); tls: (cert, key) for
    https, downgrade_to: where its mode downgrade redirects, tls_drop: how
    many handshakes it resets first."""
    args = [sys.executable, str(HERE / "server.py"), "--dir", str(root)]
    if log:
        args += ["--log", str(log)]
    if tls:
        args += ["--tls", *map(str, tls)]
    if downgrade_to:
        args += ["--downgrade-to", downgrade_to]
    if tls_drop:
        args += ["--tls-drop", str(tls_drop)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    scheme = "https" if tls else "http"
    return f"{scheme}://127.0.0.1:{int(proc.stdout.readline())}", proc
