#!/bin/sh
# The image's install steps, run inside it (Dockerfile) or inside a chroot of the same Debian packages
# (tests/test_image.py): a virtual environment of the wheels in /wheels at /opt/nodehealth, whose bin/
# comes first on PATH (so `python3` there has PyYAML for the config merge). pyverbs stays Debian's:
# nodehealth finds it in /usr/lib/python3/dist-packages when the environment has none.
set -eu
python3 -m venv /opt/nodehealth
/opt/nodehealth/bin/pip install --quiet --no-cache-dir --no-index /wheels/*.whl
/opt/nodehealth/bin/pip uninstall --quiet --yes pip
rm -rf /wheels
