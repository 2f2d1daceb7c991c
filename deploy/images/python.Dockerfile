# Local stand-in for python:3.11-slim-bookworm, for machines with no container registry
# (scripts/docker_local.sh builds it on the debootstrapped Debian image): Debian's python3.11 in a
# venv on PATH, so `pip install` works as in the official image. It trusts the build machine's CA
# bundle (host-ca.crt in the build context), which may be needed to reach the package registries.
FROM dynamo-rl-base/debian:bookworm
ENV DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/usr/local/venv \
    PATH=/usr/local/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/build-host-ca.crt \
    SSL_CERT_FILE=/etc/ssl/certs/build-host-ca.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/build-host-ca.crt
COPY host-ca.crt /etc/ssl/certs/build-host-ca.crt
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /usr/local/venv \
 && ln -s /usr/local/venv/bin/python /usr/local/bin/python3 \
 && python -m pip --version
CMD ["python3"]
