"""bench/pool's rebuild rows: a raid10 member that comes back blank is rebuilt in full from
its partner, first with resync-rate unlimited and nothing else running (how long, as a share
of what one link allows), then with resync-rate at half a link while fio reads the volume
through the same coordinator (the foreground's share of a healthy read, and the rebuild's
rate meanwhile, from the coordinator's /metrics)."""

import time
import urllib.request

POLL_SECONDS = 0.1
REBUILD_SECONDS_MAX = 180
UNLIMITED_RATE = "64G"          # resync-rate with no effect: far above any link here
FOREGROUND_SHARE = 0.5          # the issue: reads >= 0.5 of healthy while rebuilding ...
REBUILD_SHARE = 0.5             # ... at >= 0.5 of a link


def scrape(port: int) -> dict:
    """(family, member index) -> value, for the pool's member families of export "vol"."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line.startswith("sluice_pool_member_") or 'export="vol"' not in line:
            continue
        name, rest = line.split("{", 1)
        labels, value = rest.rsplit("} ", 1)
        fields = dict(kv.split("=", 1) for kv in labels.split(",") if "=" in kv)
        member = int(fields.get("member", '"-1"').strip('"'))
        if name == "sluice_pool_member_state":
            if float(value) == 1:
                out[("state", member)] = fields.get("state", "").strip('"')
        else:
            out[(name, member)] = float(value)
    return out


class Watch:
    """Member `member`'s rebuild as the coordinator's /metrics show it."""

    def __init__(self, port: int, member: int):
        self.port, self.member = port, member
        self.first = None   # (time, done bytes) at the first progress seen
        self.last = None

    def poll(self) -> str:
        """The member's state now ('' when the coordinator does not answer yet)."""
        try:
            m = scrape(self.port)
        except OSError:
            return ""
        state = m.get(("state", self.member), "")
        done = m.get(("sluice_pool_member_resync_done_bytes", self.member), 0)
        now = time.monotonic()
        if state == "resyncing" and done > 0 and self.first is None:
            self.first = (now, done)
        if state == "resyncing":
            self.last = (now, done, m.get(("sluice_pool_member_resync_total_bytes", self.member), 0))
        if state == "in-sync" and self.last is not None:
            self.last = (now, self.last[2], self.last[2])
        return state

    def until_in_sync(self) -> str:
        """Polls until the member is in sync; '' then, else why not."""
        deadline = time.monotonic() + REBUILD_SECONDS_MAX
        while time.monotonic() < deadline:
            if self.poll() == "in-sync" and self.last is not None:
                return ""
            time.sleep(POLL_SECONDS)
        return f"member not in sync within {REBUILD_SECONDS_MAX} s"

    def rate(self):
        """Bytes per second from the first progress seen to the last, or None."""
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])

    def done_now(self):
        self.poll()
        return None if self.last is None else (self.last[0], self.last[1])
