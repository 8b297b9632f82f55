#!/bin/sh
# The compose deployment's secrets, written by the one-shot `init-secrets` service before anything else starts
# (docker-compose.yml) and kept in two volumes until `docker compose down -v`:
#   API_DIR/token          the API token every service requires: GRPO_API_TOKEN when set, else generated once
#   REDIS_DIR/password     Redis's password: GRPO_REDIS_PASSWORD when set, else generated once
#   REDIS_DIR/url          redis://:<password>@redis:6379/0, the URL rollout and trainer read (GRPO_*_REDIS_URL_FILE)
#   REDIS_DIR/users.acl    Redis's ACL file: the default user, with the password's SHA-256 (not the password)
# Usage: secrets.sh [API_DIR [REDIS_DIR]]   (default /run/grpo/api and /run/grpo/redis, the volumes' mount points)
# POSIX sh and coreutils/busybox only: it runs in the redis image, which every deployment already pulls.
set -eu
api=${1:-/run/grpo/api}
redis=${2:-/run/grpo/redis}
umask 077

generate() {  # 48 hex characters from the kernel's CSPRNG
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'
}

# put FILE: stdin into FILE, written beside and renamed in (a reader never sees half a secret; the last
# one is read-only), then readable by the services' own users (uid 10001; Redis's): each volume is mounted only
# into the containers that need what it holds, and never into the reward container's sandboxes.
put() {
  cat > "$1.new"
  chmod 0444 "$1.new"
  mv -f "$1.new" "$1"
}

# keep FILE VALUE: the operator's value when given (replacing an earlier one), else the one kept from the last
# `up`, else a new one.
keep() {
  if [ -n "$2" ]; then
    printf '%s' "$2" | put "$1"
  elif [ ! -s "$1" ]; then
    generate | put "$1"
  fi
}

case ${GRPO_REDIS_PASSWORD:-} in
  *[!A-Za-z0-9._~-]*)
    echo "GRPO_REDIS_PASSWORD may hold only letters, digits and . _ ~ - (it is written into a redis:// URL)" >&2
    exit 2 ;;
esac
keep "$api/token" "${GRPO_API_TOKEN:-}"
keep "$redis/password" "${GRPO_REDIS_PASSWORD:-}"
password=$(cat "$redis/password")
printf 'redis://:%s@redis:6379/0\n' "$password" | put "$redis/url"
hash=$(printf '%s' "$password" | sha256sum | cut -d' ' -f1)
printf 'user default on #%s ~* &* +@all\n' "$hash" | put "$redis/users.acl"
echo "secrets ready: the API token in $api/token, Redis's password in $redis/password"
