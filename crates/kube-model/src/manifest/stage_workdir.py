# The `stage-workdir` init container of an Iris task pod: fills the task's working directory
# before the task container starts, so the task image needs no curl or unzip (only Python,
# which task images have). Standard library only. Written for Iris in Rust; the settings come
# from the environment the pod manifest gives this container:
#   IRIS_WORKDIR             where to stage (the `workdir` volume, /app)
#   IRIS_CONTROLLER_URL      the controller, for the bundle and blobs
#   IRIS_BUNDLE_ID           a bundle to unpack (its id is the SHA-256 of the zip)
#   IRIS_WORKDIR_BLOB_REFS   JSON {relative path: SHA-256} of files held by the controller
#   IRIS_WORKDIR_FILES_SRC   a directory of files to copy in (the job's ConfigMap)
# Any failure exits non-zero with one line on stderr saying what failed; the pod reports it as
# `Init:Error stage-workdir: <that line>`.
import hashlib
import json
import os
import shutil
import stat
import sys
import time
import urllib.request
import zipfile


def fail(msg):
    sys.stderr.write("stage-workdir: " + msg + "\n")
    sys.exit(1)


def inside(root, rel):
    """The absolute path of `rel` under `root`, refusing anything that escapes it."""
    if os.path.isabs(rel):
        fail("refusing absolute path %r" % rel)
    path = os.path.normpath(os.path.join(root, rel))
    if path != root and not path.startswith(root + os.sep):
        fail("refusing path %r: it leaves the working directory" % rel)
    return path


def fetch(url, sha):
    """GET `url`, checking the body's SHA-256 when `sha` is one; three tries with backoff."""
    last = None
    for attempt in range(3):
        if attempt:
            time.sleep(2 ** (attempt - 1))
        try:
            with urllib.request.urlopen(url, timeout=300) as resp:
                body = resp.read()
        except Exception as e:  # network errors and HTTP errors alike: try again
            last = e
            continue
        if sha and len(sha) == 64 and hashlib.sha256(body).hexdigest() != sha.lower():
            last = "its SHA-256 is not %s" % sha
            continue
        return body
    fail("fetching %s failed: %s" % (url, last))


def unpack(data, root):
    path = os.path.join(root, ".iris-bundle.zip")
    with open(path, "wb") as f:
        f.write(data)
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                target = inside(root, info.filename)
                if info.is_dir():
                    os.makedirs(target, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    os.chmod(target, mode)
    except zipfile.BadZipFile as e:
        fail("the bundle is not a zip file: %s" % e)
    finally:
        os.remove(path)


def copy_tree(src, root):
    for dirpath, _, files in os.walk(src, followlinks=True):
        for name in files:
            if name.startswith(".."):
                continue  # a ConfigMap volume's own bookkeeping (..data, ..<timestamp>)
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, src)
            if rel.split(os.sep)[0].startswith(".."):
                continue
            target = inside(root, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(full, target)
            os.chmod(target, stat.S_IMODE(os.stat(full).st_mode) | 0o600)


def main():
    root = os.path.normpath(os.environ.get("IRIS_WORKDIR") or "/app")
    os.makedirs(root, exist_ok=True)
    url = (os.environ.get("IRIS_CONTROLLER_URL") or "").rstrip("/")
    bundle = os.environ.get("IRIS_BUNDLE_ID") or ""
    if bundle:
        if not url:
            fail("IRIS_BUNDLE_ID is set but IRIS_CONTROLLER_URL is not")
        unpack(fetch("%s/bundles/%s.zip" % (url, bundle), bundle), root)
    src = os.environ.get("IRIS_WORKDIR_FILES_SRC") or ""
    if src:
        copy_tree(src, root)
    refs = os.environ.get("IRIS_WORKDIR_BLOB_REFS") or ""
    if refs:
        try:
            refs = json.loads(refs)
        except ValueError as e:
            fail("IRIS_WORKDIR_BLOB_REFS is not JSON: %s" % e)
        for rel, sha in sorted(refs.items()):
            target = inside(root, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(fetch("%s/blobs/%s" % (url, sha), sha))


main()
