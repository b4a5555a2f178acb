"""Packs a static ``pause`` binary into a docker-archive tarball that ``ctr images
import`` takes: a manifest, an image config and one layer, made without any engine.

    python3 pause-image.py PAUSE_BINARY TAG OUT.tar
"""

import hashlib
import io
import json
import sys
import tarfile


def main(binary: str, tag: str, out: str) -> None:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tar.gettarinfo(binary, arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755
        with open(binary, "rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]
    ).encode()
    with tarfile.open(out, mode="w") as tar:
        for name, data in (
            ("layer.tar", layer_bytes),
            (config_name, config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main(*sys.argv[1:4])
