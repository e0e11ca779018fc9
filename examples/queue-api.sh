#!/bin/sh
# The sidecar's queue HTTP API (SLUICE_API_LISTEN=127.0.0.1:7070). OpenAPI: GET /openapi.json
set -eu
API=${API:-http://127.0.0.1:7070}
# In an injected pod whose sidecar checks callers (the chart's default), send the pod's token for the
# queue API; without it, calls from the pod's own loopback act as its ServiceAccount. Either way the
# ServiceAccount needs a Role granting jobqueues/jobs (and jobqueues/settings for PUT, pause, resume):
# docs/queue.md, "Who may call the API".
if [ -n "${SLUICE_QUEUE_API_TOKEN_FILE:-}" ]; then
  curl() { command curl -H "Authorization: Bearer $(cat "$SLUICE_QUEUE_API_TOKEN_FILE")" "$@"; }
fi

curl -sS -X PUT "$API/v1/queues/emails" -d '{"maxAttempts": 10, "leaseDuration": "30s"}'
# 201 the first time; 200 with the same job when repeated with the same key and body; 409 with another body
curl -sS -X POST "$API/v1/queues/emails/jobs" -H 'Idempotency-Key: welcome-42' \
     -d '{"kind": "welcome", "payload": {"to": "a@example.com"}, "delayMs": 1000}'
curl -sS -X POST "$API/v1/queues/emails/jobs/batch" \
     -d '{"jobs": [{"kind": "digest", "payload": {"to": "b"}}, {"kind": "digest", "payload": {"to": "c"}}]}'
curl -sS "$API/v1/queues/emails/stats"
curl -sS "$API/v1/queues/emails/jobs?state=dead&limit=50"
# curl -sS -X POST "$API/v1/jobs/$ID/cancel"   # 200 / 202 / 409
# curl -sS -X POST "$API/v1/jobs/$ID/retry"    # dead jobs only
