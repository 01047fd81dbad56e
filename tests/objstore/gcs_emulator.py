"""gcp-storage-emulator on 127.0.0.1 and an ephemeral port, for the object-storage tests.

Usage: python gcs_emulator.py BUCKET...   (creates the buckets, prints "listening on URL")

The emulator (PyPI `gcp-storage-emulator`) serves the GCS JSON API and the XML API's object GET and
PUT. The `object_store` crate's GCS client also uses the XML API to list a bucket
(`GET /<bucket>?list-type=2`) and to delete an object (`DELETE /<bucket>/<object>`), and expects an
`ETag` and `Last-Modified` on XML GET/PUT responses. This launcher answers those XML requests from
the emulator's own storage, and hands every other request to the emulator unchanged. Requests are
served one at a time (the emulator's storage is not thread-safe).
"""

import sys
import threading
import xml.sax.saxutils as sx
from email.utils import formatdate
from datetime import datetime
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

from gcp_storage_emulator import server as emu
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets, objects
from gcp_storage_emulator.storage import Storage

LOCK = threading.Lock()
JSON_PREFIXES = ("/storage/", "/upload/", "/download/", "/batch/", "/b/", "/wipe")


def http_date(rfc3339):
    try:
        ts = datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
    except (TypeError, ValueError):
        ts = None
    return formatdate(ts, usegmt=True)


def etag(obj):
    return '"{}"'.format(obj.get("md5Hash") or obj.get("generation") or "0")


class Handler(emu.RequestHandler):
    def _xml_target(self):
        url = urlparse(self.path)
        if url.path.startswith(JSON_PREFIXES) or url.path == "/":
            return None
        parts = url.path[1:].split("/", 1)
        bucket = unquote(parts[0])
        name = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
        return bucket, name, parse_qs(url.query)

    def _send(self, status, body=b"", headers=None):
        self.send_response(status.value)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _list(self, bucket, query):
        q = lambda k: query.get(k, [None])[0]
        try:
            files, prefixes = self.storage.get_file_list(bucket, q("prefix"), q("delimiter"))
        except NotFound:
            return self._send(HTTPStatus.NOT_FOUND, b"NoSuchBucket")
        out = ['<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>']
        out.append("<Name>{}</Name><KeyCount>{}</KeyCount>".format(sx.escape(bucket), len(files)))
        for f in files:
            out.append(
                "<Contents><Key>{}</Key><Size>{}</Size><LastModified>{}</LastModified>"
                "<ETag>{}</ETag></Contents>".format(
                    sx.escape(f["name"]), f.get("size", 0), f.get("updated"), sx.escape(etag(f))
                )
            )
        for p in prefixes:
            out.append("<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>".format(sx.escape(p)))
        out.append("</ListBucketResult>")
        self._send(HTTPStatus.OK, "".join(out).encode(), {"Content-Type": "application/xml"})

    def _meta_headers(self, obj):
        return {
            "ETag": etag(obj),
            "Last-Modified": http_date(obj.get("updated")),
            "x-goog-generation": str(obj.get("generation", "1")),
        }

    def _xml(self):
        target = self._xml_target()
        if target is None:
            return False
        bucket, name, query = target
        if name is None:
            if self.command == "GET":
                self._list(bucket, query)
            else:
                self._send(HTTPStatus.NOT_IMPLEMENTED)
            return True
        try:
            if self.command in ("GET", "HEAD"):
                data = self.storage.get_file(bucket, name)
                obj = self.storage.get_file_obj(bucket, name)
                h = self._meta_headers(obj)
                h["Content-Type"] = "application/octet-stream"
                self._send(HTTPStatus.OK, data, h)
            elif self.command == "PUT":
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length)
                if len(data) != length:
                    return True  # the client went away mid-body: store nothing
                obj = objects._make_object_resource(
                    "http://{}".format(self.headers.get("Host")), bucket, name,
                    "application/octet-stream", str(len(data)),
                )
                obj = objects._checksums(data, obj)
                self.storage.create_file(bucket, name, data, obj)
                self._send(HTTPStatus.OK, b"", self._meta_headers(obj))
            elif self.command == "DELETE":
                self.storage.delete_file(bucket, name)
                self._send(HTTPStatus.NO_CONTENT)
            else:
                self._send(HTTPStatus.NOT_IMPLEMENTED)
        except NotFound:
            self._send(HTTPStatus.NOT_FOUND, b"NoSuchKey")
        return True

    def _handle(self, fallback):
        with LOCK:
            if not self._xml():
                fallback()

    def do_GET(self):
        self._handle(super().do_GET)

    def do_HEAD(self):
        self._handle(lambda: self._send(HTTPStatus.NOT_IMPLEMENTED))

    def do_PUT(self):
        self._handle(super().do_PUT)

    def do_DELETE(self):
        self._handle(super().do_DELETE)

    def do_POST(self):
        with LOCK:
            super().do_POST()

    def log_message(self, format, *args):
        sys.stderr.write("%s\n" % (format % args))


def main():
    storage = Storage(use_memory_fs=True)
    for b in sys.argv[1:]:
        buckets.create_bucket(b, storage)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **k: Handler(storage, *a, **k))
    print("listening on http://127.0.0.1:{}".format(httpd.server_address[1]), flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
