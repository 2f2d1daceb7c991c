# Local stand-in for redis:7.4-bookworm (scripts/docker_local.sh): Debian's redis-server. Like the
# official image's entrypoint, a `redis-server ...` command gets `--protected-mode no` (Debian's
# default, protected mode, refuses every peer container); compose keeps Redis on its networks.
FROM dynamo-rl-base/debian:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data \
 && printf '%s\n' '#!/bin/sh' \
      'if [ "$1" = redis-server ]; then shift; set -- redis-server "$@" --protected-mode no; fi' \
      'exec "$@"' > /usr/local/bin/docker-entrypoint.sh \
 && chmod 0755 /usr/local/bin/docker-entrypoint.sh
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
CMD ["redis-server"]
