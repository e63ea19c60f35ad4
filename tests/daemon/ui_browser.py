#!/usr/bin/env python3
"""Loads towerd's page in headless chromium and waits, inside the page, until the chat box's first
reply has streamed to its end; then writes the DOM and a screenshot.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
separated by NUL on fds 3 and 4), so nothing beyond the standard library is needed. The wait is a
condition, not a clock: one Runtime.evaluate awaits a promise that resolves when #reply-1 carries
data-done (or the page shows an error), bounded by --wait seconds in case the page never gets there.
(A --dump-dom with --virtual-time-budget dumped the DOM while the stream was still being read on a
busy machine: a streamed body does not hold virtual time.)

  ui_browser.py CHROMIUM URL DOM_OUT PNG_OUT [--wait SECONDS] [--profile DIR]
"""
import argparse
import base64
import fcntl
import json
import os
import subprocess
import sys


class DevTools:
    def __init__(self, chromium, profile):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def fds():  # in the child: commands on fd 3, replies on fd 4 (moved up first: either may be 3 or 4)
            commands, replies = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child_r, from_child_w))
            os.dup2(commands, 3)
            os.dup2(replies, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "--window-size=1200,900",
             "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4),  # what survives the closing of fds after preexec_fn
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(profile, "chromium.log"), "ab"))
        os.close(to_child_r)
        os.close(from_child_w)
        self.buffer = b""
        self.next_id = 0
        self.events = []

    def _read_message(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.from_child, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, session=None, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_event(self, method, session):
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            event = self._read_message()
            if event.get("method") == method and event.get("sessionId") == session:
                return event
            self.events.append(event)

    def close(self):
        try:
            self.call("Browser.close")
        except RuntimeError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# Resolves once the first reply is finished or the page reports an error; rejects after `wait` s.
WAIT_FOR_REPLY = """
new Promise((resolve, reject) => {
  const state = () => {
    const done = document.querySelector('#reply-1[data-done="true"]');
    if (done) return "done";
    const error = document.querySelector('.msg.error');
    if (error) return "error: " + error.textContent;
    return null;
  };
  const now = state();
  if (now) return resolve(now);
  const observer = new MutationObserver(() => {
    const s = state();
    if (s) { observer.disconnect(); resolve(s); }
  });
  observer.observe(document.body, { subtree: true, childList: true, attributes: true, characterData: true });
  setTimeout(() => { observer.disconnect(); resolve(state() || "timeout"); }, %d);
})
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("chromium")
    parser.add_argument("url")
    parser.add_argument("dom_out")
    parser.add_argument("png_out")
    parser.add_argument("--wait", type=float, default=90.0)
    parser.add_argument("--profile", default=".")
    args = parser.parse_args()
    os.makedirs(args.profile, exist_ok=True)
    tools = DevTools(args.chromium, args.profile)
    try:
        target = tools.call("Target.createTarget", url="about:blank")["targetId"]
        session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        tools.call("Page.enable", session)
        tools.call("Page.navigate", session, url=args.url)
        tools.wait_event("Page.loadEventFired", session)
        state = tools.call("Runtime.evaluate", session, expression=WAIT_FOR_REPLY % int(args.wait * 1000),
                           awaitPromise=True, returnByValue=True)["result"].get("value")
        dom = tools.call("Runtime.evaluate", session, expression="document.documentElement.outerHTML",
                         returnByValue=True)["result"]["value"]
        with open(args.dom_out, "w") as f:
            f.write(dom)
        shot = tools.call("Page.captureScreenshot", session, format="png")["data"]
        with open(args.png_out, "wb") as f:
            f.write(base64.b64decode(shot))
    finally:
        tools.close()
    print(f"the page's chat: {state}")
    return 0 if state == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
