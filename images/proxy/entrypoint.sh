#!/usr/bin/env bash
# Start the front door: substitute the API key into a private copy of the rendered config, test it, run nginx.
#
# In:  /etc/ds4deploy/front-door.conf.template (rendered by ds4deploy, mounted read-only; holds ${VLLM_API_KEY}
#      and ${DS4_METRICS_KEY})
#      VLLM_API_KEY (from the recipe's 0600 key file, through the compose env_file)
#      DS4_METRICS_KEY (the read-only /metrics credential, from <key file>.metrics.env, 0600, the same way)
#      DS4_GATEWAY_KEY (optional: the key of a gateway this deployment serves behind, from <key file>.gateway.env,
#      0600; accepted beside VLLM_API_KEY. Unset: the template's lines naming it are dropped, so no second key opens
#      the door)
# Out: /run/front-door/nginx.conf (mode 0600, tmpfs: never on disk, never in the image); FRONT_DOOR_CONF moves it
#      (tests run this script outside the image)
# Exit 2 with "error: ... / fix: ..." when the key or the config is unusable; nothing listens then.
set -euo pipefail

template=${FRONT_DOOR_TEMPLATE:-/etc/ds4deploy/front-door.conf.template}
conf=${FRONT_DOOR_CONF:-/run/front-door/nginx.conf}

fail() { echo "error: $1" >&2; echo "fix: $2" >&2; exit 2; }

[ -r "$template" ] || fail "no front door config at $template" "run \`ds4deploy render\` and deploy again"
[ -n "${VLLM_API_KEY:-}" ] || fail "VLLM_API_KEY is empty or unset" \
  "the recipe's key file must hold a VLLM_API_KEY= line: delete it and deploy again to regenerate it"
# The key goes into nginx regular expressions: only characters that are literal there and need no quoting.
case "$VLLM_API_KEY" in
  *[!A-Za-z0-9_-]*) fail "VLLM_API_KEY holds characters other than A-Z a-z 0-9 _ -" \
    "use a key of those characters only (the deploy generates ds4-<40 letters and digits>)" ;;
esac
[ -n "${DS4_METRICS_KEY:-}" ] || fail "DS4_METRICS_KEY is empty or unset" \
  "the metrics key file (<key file>.metrics.env) must hold a DS4_METRICS_KEY= line: delete it and deploy again to regenerate it"
case "$DS4_METRICS_KEY" in
  *[!A-Za-z0-9_-]*) fail "DS4_METRICS_KEY holds characters other than A-Z a-z 0-9 _ -" \
    "use a key of those characters only (the deploy generates ds4m-<40 letters and digits>)" ;;
esac
[ "$DS4_METRICS_KEY" != "$VLLM_API_KEY" ] || fail "DS4_METRICS_KEY is the API key" \
  "give /metrics a key of its own: delete the metrics key file and deploy again to regenerate it"
if [ -n "${DS4_GATEWAY_KEY:-}" ]; then
  case "$DS4_GATEWAY_KEY" in
    *[!A-Za-z0-9_-]*) fail "DS4_GATEWAY_KEY holds characters other than A-Z a-z 0-9 _ -" \
      "put the gateway's key (its key file's VLLM_API_KEY, ds4-<letters and digits>) in <key file>.gateway.env" ;;
  esac
  if [ "$DS4_GATEWAY_KEY" = "$VLLM_API_KEY" ] || [ "$DS4_GATEWAY_KEY" = "$DS4_METRICS_KEY" ]; then
    fail "DS4_GATEWAY_KEY is this deployment's API key or metrics key" \
      "give the gateway a key of its own (its key file's VLLM_API_KEY), not a backend's key"
  fi
fi

umask 077
mkdir -p "$(dirname "$conf")"
# Only the keys are substituted; nginx's own $variables stay as they are. The single quotes are meant: envsubst's
# SHELL-FORMAT argument and sed's pattern name the variables literally (shellcheck SC2016 is about shell expansion).
# Without a gateway key its lines go: substituted empty, "~^$" would open the door to an empty x-api-key.
# shellcheck disable=SC2016
if [ -n "${DS4_GATEWAY_KEY:-}" ]; then
  envsubst '${VLLM_API_KEY} ${DS4_METRICS_KEY} ${DS4_GATEWAY_KEY}' <"$template" >"$conf"
else
  sed '/${DS4_GATEWAY_KEY}/d' "$template" | envsubst '${VLLM_API_KEY} ${DS4_METRICS_KEY}' >"$conf"
fi
unset VLLM_API_KEY DS4_METRICS_KEY DS4_GATEWAY_KEY
nginx -e stderr -t -q -c "$conf" || fail "nginx rejects the front door config (rendered from $template)" \
  "render it again with \`ds4deploy render\`; if that does not help, report the nginx message above"
exec nginx -e stderr -c "$conf" -g 'daemon off;'
