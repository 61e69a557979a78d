#!/usr/bin/env python3
"""A threaded HTTP server with byte ranges, ETags and If-Match, serving the
files of one folder, and failing on purpose: the first segment of the path
picks the behaviour, the rest names the file (/ok/model.safetensors).

  server.py --dir DIR [--port 0] [--log FILE]   # prints "PORT" on stdout
            [--tls CERT KEY] [--downgrade-to URL]  # https; URL: mode downgrade's target
            [--tls-drop N]  # the first N TLS handshakes: reset (as a loaded S3 does)

Modes (counters are per file and mode, reset by GET /reset):
  ok          ranges, ETag, Last-Modified, If-Match (412), as nginx serves
              (also as "signed", a name that s3://signed/... can use)
  flaky       the first 2 requests of each file: HTTP 500; then ok
  always500   every request: HTTP 503
  reset       the first data request of each file (after the header's):
              half the body, then a TCP reset; then ok
  short       every data request: Content-Length as asked, half the body sent
  capped      honest short answers: at most 1 MiB per response (Content-Range says so)
  changed     after the first request of each file its ETag changes: If-Match
              gets 412
  changed-noetag-check  as changed, but If-Match is ignored (the new ETag only
              shows in the response)
  forbidden   HTTP 403 with an S3 error body
  missing     HTTP 404 with an S3 error body
  norange     Range ignored: 200 with the whole file
  wholeok     200 with the whole file where the range covers all of it (as a
              server may), else as ok
  loop        a redirect to itself, forever
  listloop    (a bucket, path style) an S3 listing whose pages hand out the
              continuation tokens T1, T2, T1, ...: it never ends
  redirect    one redirect to /ok/...
  elsewhere   one redirect to /ok/... on another host name (localhost for
              127.0.0.1): a client must not take a signed request's
              headers there
  longetag    as ok, with a 300-character ETag (If-Match compared whole)
  nocr        data requests: HTTP 206 without a Content-Range
  overdeclared  data requests: every byte of the range, a Content-Length one
              more, then the connection closed (the client has all it asked
              for, and a transfer error)
  downgrade   one redirect to --downgrade-to's /ok/... (from https to http)
  stall       the headers of data requests, then nothing (until the client leaves)
  slow        data requests answered at about 2 MiB/s
  crawl       data requests answered at about 2 KiB/s: above a 1 KiB/s stall
              limit, never done in time
  overlong    data requests: a Content-Range naming the first half of the
              bytes asked, and a body of all of them whose second half is
              0xEE (other bytes than the file's)
  dribble     every data request: its headers, 2 KiB of the body, then the
              connection closed (progress on every attempt, never done)
  trickle     honest short answers of at most 100 bytes (Content-Range says so)
  trailer     data requests: chunked, with a trailer ETag other than the
              header's (the body was judged by the header's)

Every request's method, path and headers go to --log as one JSON line, so
tests can check what the client sent (signatures, If-Match). Loopback only.
"""
import argparse
import email.utils
import json
import os
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
COUNTS = {}
LOG = None
ROOT = None
DOWNGRADE_TO = None


def count(key):
    with LOCK:
        COUNTS[key] = COUNTS.get(key, 0) + 1
        return COUNTS[key]


def list_loop_page(path):
    """A ListObjectsV2 page of listloop: three keys under the prefix asked,
    truncated, the next token T1 after none or T2, else T2."""
    from urllib.parse import parse_qs, urlsplit
    q = parse_qs(urlsplit(path).query)
    prefix = q.get("prefix", [""])[0]
    token = q.get("continuation-token", [None])[0]
    nxt = "T2" if token == "T1" else "T1"
    keys = "".join(f"<Contents><Key>{prefix}{token or 'T0'}-{i}.bin</Key></Contents>"
                   for i in range(3))
    return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>listloop</Name>'
            f"<Prefix>{prefix}</Prefix>{keys}<IsTruncated>true</IsTruncated>"
            f"<NextContinuationToken>{nxt}</NextContinuationToken></ListBucketResult>").encode()


def s3_error(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def record(self):
        if LOG:
            with LOCK:
                LOG.write(json.dumps({"method": self.command, "path": self.path,
                                      "headers": dict(self.headers.items())}) + "\n")
                LOG.flush()

    def plain(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_range(self, f, a, b, size, ident):
        """A 206 whose body goes by sendfile: no copy through Python and the
        GIL released, so that benchmarks measure the client, not this."""
        self.send_response(206)
        for k, v in ident:
            self.send_header(k, v)
        self.send_header("Content-Range", f"bytes {a}-{b}/{size}")
        self.send_header("Content-Length", str(b - a + 1))
        self.end_headers()
        self.wfile.flush()
        off, n = a, b - a + 1
        if hasattr(self.connection, "cipher"):  # TLS: sendfile would bypass it
            f.seek(a)
            self.wfile.write(f.read(n))
            return
        while n:
            sent = os.sendfile(self.connection.fileno(), f.fileno(), off, n)
            if not sent:
                raise ConnectionError("the file ended")
            off += sent
            n -= sent

    def do_GET(self):
        self.record()
        if self.path == "/reset":
            with LOCK:
                COUNTS.clear()
            return self.plain(200, b"ok")
        if self.path.startswith("/listloop?"):
            return self.plain(200, list_loop_page(self.path))
        # a query (a presigned URL's) names no file
        parts = self.path.partition("?")[0].lstrip("/").split("/", 1)
        if len(parts) != 2:
            return self.plain(404, s3_error("NoSuchKey", "no mode"))
        mode, name = parts
        if mode == "signed":  # an S3 bucket's name (3 letters at least) for ok
            mode = "ok"
        path = os.path.join(ROOT, name)
        n = count((mode, name))
        if mode == "forbidden":
            return self.plain(403, s3_error("AccessDenied", "Access Denied"))
        if mode == "missing" or not os.path.isfile(path):
            return self.plain(404, s3_error("NoSuchKey", "The specified key does not exist."))
        if mode == "flaky" and n <= 2:
            return self.plain(500, s3_error("InternalError", "try again"))
        if mode == "always500":
            return self.plain(503, s3_error("SlowDown", "Please reduce your request rate."))
        if mode == "loop":
            return self.plain(302, headers=[("Location", self.path)])
        if mode == "redirect":
            return self.plain(302, headers=[("Location", "/ok/" + name)])
        if mode == "downgrade":
            return self.plain(302, headers=[("Location", f"{DOWNGRADE_TO}/ok/{name}")])
        if mode == "elsewhere":
            port = self.server.server_address[1]
            return self.plain(302, headers=[("Location", f"http://localhost:{port}/ok/{name}")])
        st = os.stat(path)
        size = st.st_size
        etag = '"%x-%x"' % (int(st.st_mtime), size)
        if mode.startswith("changed") and n > 1:
            etag = '"%x-%x-new"' % (int(st.st_mtime), size)
        if mode == "longetag":
            etag = '"%s"' % ("%x-%x" % (int(st.st_mtime), size)).ljust(298, "e")
        modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        ident = [("ETag", etag), ("Last-Modified", modified), ("Accept-Ranges", "bytes")]
        want = self.headers.get("If-Match")
        if want and mode != "changed-noetag-check" and want != etag:
            return self.plain(412, s3_error("PreconditionFailed", "If-Match"), ident)
        rng = self.headers.get("Range")
        with open(path, "rb") as f:
            if not rng or mode == "norange":
                return self.plain(200, f.read(), ident)
            a, _, b = rng.split("=", 1)[1].partition("-")
            a = int(a)
            b = min(int(b) if b else size - 1, size - 1)
            if a >= size:
                return self.plain(416, headers=[("Content-Range", f"bytes */{size}")] + ident)
            if mode == "wholeok" and a == 0 and b == size - 1:
                return self.plain(200, f.read(), ident)
            if mode == "wholeok":
                mode = "ok"
            if mode in ("ok", "longetag"):
                return self.send_range(f, a, b, size, ident)
            if mode == "capped":
                b = min(b, a + (1 << 20) - 1)
            if mode == "trickle" and a > 0:
                b = min(b, a + 99)
            f.seek(a)
            body = f.read(b - a + 1)
        data_request = a > 0
        said = b
        if mode == "overlong" and data_request and b > a:
            said = a + (b - a + 1) // 2 - 1
            body = body[:said - a + 1] + b"\xee" * (b - said)
        if mode == "trailer" and data_request:
            self.send_response(206)
            for k, v in ident + [("Content-Range", f"bytes {a}-{b}/{size}"),
                                 ("Transfer-Encoding", "chunked"), ("Trailer", "ETag")]:
                self.send_header(k, v)
            self.end_headers()
            for i in range(0, len(body), 1 << 20):
                piece = body[i:i + (1 << 20)]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b'0\r\nETag: "other-in-trailer"\r\n\r\n')
            return
        self.send_response(206)
        for k, v in ident:
            self.send_header(k, v)
        if not (mode == "nocr" and data_request):
            self.send_header("Content-Range", f"bytes {a}-{said}/{size}")
        self.send_header("Content-Length", str(len(body) + (mode == "overdeclared" and data_request)))
        self.end_headers()
        if mode == "overdeclared" and data_request:
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
            return
        if mode == "stall" and data_request:
            self.wfile.flush()
            while True:
                time.sleep(0.05)
                try:
                    self.connection.send(b"")
                except OSError:
                    return
        if mode == "reset" and data_request and count((mode, name, "data")) == 1:
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            # SO_LINGER 0: close with a reset, not a FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if mode == "dribble" and data_request:
            self.wfile.write(body[:2048])
            self.wfile.flush()
            self.close_connection = True
            return
        if mode == "short" and data_request:
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if mode == "crawl" and data_request:
            try:
                for i in range(0, len(body), 100):
                    self.wfile.write(body[i:i + 100])
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass
            return
        if mode == "slow" and data_request:
            for i in range(0, len(body), 64 << 10):
                self.wfile.write(body[i:i + (64 << 10)])
                time.sleep(0.03)
            return
        self.wfile.write(body)


def main():
    global LOG, ROOT, DOWNGRADE_TO
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--downgrade-to")
    ap.add_argument("--tls-drop", type=int, default=0)
    a = ap.parse_args()
    ROOT = os.path.abspath(a.dir)
    LOG = open(a.log, "a") if a.log else None
    DOWNGRADE_TO = a.downgrade_to
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    if a.tls:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*a.tls)
        drop = [a.tls_drop]

        class Listener(socket.socket):
            """Accepts; the first --tls-drop connections are reset before
            their handshake, the rest get TLS."""
            def accept(self):
                while True:
                    conn, addr = super().accept()
                    if drop[0] <= 0:
                        return ctx.wrap_socket(conn, server_side=True), addr
                    drop[0] -= 1
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    conn.close()

        plain = srv.socket
        srv.socket = Listener(plain.family, plain.type, fileno=plain.detach())
    print(srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
