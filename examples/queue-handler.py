#!/usr/bin/env python3
"""A minimal job handler for the sidecar worker (standard library only).

Run it, then: SLUICE_DATABASE_URL=postgres://... SLUICE_QUEUES=emails \
              SLUICE_HANDLER_URL=http://127.0.0.1:3000/jobs sluice-sidecar worker
2xx = done; 422 = failed for good (dead letter); anything else = retry with backoff.
"""
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Jobs(BaseHTTPRequestHandler):
    def do_POST(self):
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        kind = self.headers["Sluice-Job-Kind"]
        attempt = int(self.headers["Sluice-Job-Attempt"])
        print(f"job {self.headers['Sluice-Job-Id']} {kind} attempt {attempt}: {payload}")
        if "to" not in payload:
            self.send_response(422)  # bad input: retrying will not help
        else:
            self.send_response(200)
        self.end_headers()


ThreadingHTTPServer(("127.0.0.1", 3000), Jobs).serve_forever()
