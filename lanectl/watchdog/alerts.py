"""What the watchdog tells the outside world: webhook alerts and node_exporter textfile metrics.

Alerts are best effort: a watchdog pass must not fail because a chat service is down, so
`WebhookAlerter.send` returns an `AlertDelivery` instead of raising. A metrics file that cannot be
written is a setup mistake the operator must hear about: `PrometheusTextfile.write` raises
`OperationFailed`, for the caller to report without ending its pass.

The webhook URL is a secret: Slack/Mattermost-style incoming webhooks embed their token in the
path (and some providers in the host). It is read from the environment at send time, used for
the request, and never kept: details, reprs and log lines name the *variable* that holds it, and
httpx's own request logs are scrubbed of it while a request runs.

httpx, tenacity and logging are imported only once a webhook URL is there to send to: the watchdog journals an
alert at every restart, and on a lane without a webhook that must not load an HTTP client (~3 MiB that
`watchdog run` would keep for good).
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, field
from pathlib import Path
from typing import TYPE_CHECKING

from lanectl.errors import OperationFailed
from lanectl.records import frozen
from lanectl.state.atomic import write_atomically

if TYPE_CHECKING:
    import logging

    import httpx
    from tenacity import RetryCallState
    from tenacity.wait import wait_base

SEVERITIES = ("critical", "warning", "info")
WEBHOOK_TIMEOUT_SECONDS = 10.0
# One delivery, retries and their waits included, ends by this deadline: an alert is sent from inside
# a watchdog pass, and a webhook that answers slowly (or drips its answer byte by byte) must not hold
# the pass past its next probe. The watchdog gives a tighter one from the lane's poll interval.
DEFAULT_DELIVERY_DEADLINE_SECONDS = 10.0
# Only an excerpt of an error body reaches the journal; reading more is a webhook making us wait.
MAX_RESPONSE_BYTES = 64 * 1024
# httpx logs every request URL at INFO; httpcore logs the host it connects to at DEBUG.
HTTP_CLIENT_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)
REDACTED = "<redacted>"


@frozen
class Alert:
    severity: str  # "critical" | "warning" | "info"
    lane: str | None
    title: str
    detail: str
    host: str
    ts: str  # ISO-8601 UTC
    facts: dict[str, str] = field(default_factory=dict)  # e.g. {"xid": "79", "pci": "0000:01:00"}

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"alert severity must be one of {', '.join(SEVERITIES)}, got {self.severity!r}")

    def summary(self) -> str:
        """One line for a chat channel, e.g. `lanectl CRITICAL h2-REF on dgx1: Xid 79 — GPU has fallen off the bus`."""
        subject = self.lane if self.lane is not None else "host"
        line = f"lanectl {self.severity.upper()} {subject} on {self.host}: {self.title}"
        if self.detail:
            line += f" — {self.detail}"
        return _one_line(line)


@frozen
class AlertDelivery:
    delivered: bool
    attempts: int  # requests tried; 0 when there was nothing to send to
    detail: str


@frozen
class _Answer:
    """One try at the webhook: its HTTP status, or why there was none."""

    status: int | None = None
    body_excerpt: str = ""
    error: str | None = None  # "ConnectError: [Errno 111] Connection refused", scrubbed of the URL
    failure: str = "failed"  # how the error reads in a detail: "could not connect", "timed out", …
    retryable: bool = False


class WebhookAlerter:
    """Posts alerts as JSON to the webhook URL held by the environment variable named `url_env`."""

    def __init__(
        self,
        url_env: str | None,
        *,
        environ: Mapping[str, str] = os.environ,
        client: httpx.Client | None = None,
        attempts: int = 4,
        wait: wait_base | None = None,  # between tries: exponential, 1 s doubling up to 10 s
        deadline_seconds: float = DEFAULT_DELIVERY_DEADLINE_SECONDS,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"a webhook needs at least 1 attempt, got {attempts}")
        if not deadline_seconds > 0:
            raise ValueError(f"a delivery deadline must be positive, got {deadline_seconds}")
        self.url_env = url_env
        self.attempts = attempts
        self.deadline_seconds = deadline_seconds
        self._environ = environ
        self._client = client
        self._wait = wait

    def __repr__(self) -> str:
        return f"WebhookAlerter(url_env={self.url_env!r}, attempts={self.attempts})"

    def send(self, alert: Alert) -> AlertDelivery:
        if self.url_env is None:
            return AlertDelivery(False, 0, "no webhook: alerting has no webhook variable configured")
        url = self._environ.get(self.url_env, "").strip()
        if not url:
            return AlertDelivery(False, 0, f"no webhook: ${self.url_env} is not set")
        from tenacity import Retrying, retry_if_result, wait_exponential

        redaction = UrlRedaction(url)
        between_tries = self._wait or wait_exponential(multiplier=1, min=1, max=10)
        body: dict[str, object] = {"text": alert.summary(), "alert": asdict(alert)}
        deadline = time.monotonic() + self.deadline_seconds

        def remaining() -> float:
            return deadline - time.monotonic()

        retrying = Retrying(
            stop=lambda state: state.attempt_number >= self.attempts or remaining() <= 0,
            # A wait never reaches past the deadline; the last try then gets what time is left.
            wait=lambda state: max(0.0, min(between_tries(state), remaining())),
            retry=retry_if_result(lambda answer: answer.retryable),
            # When the attempts run out, tenacity hands back the last answer instead of raising RetryError.
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
            before_sleep=self._log_retry,
        )
        outcome: list[_Answer] = []
        tries = [0]  # counted here: tenacity keeps its statistics per thread

        def attempt(client: httpx.Client) -> _Answer:
            tries[0] += 1
            return self._post(client, url, body, redaction, remaining)

        def deliver() -> None:
            with self._http_client() as client, scrubbed_http_client_logs(redaction):
                outcome.append(retrying(attempt, client))

        # httpx's timeouts bound each read, not a whole response: a server dripping a byte a second
        # would never time out. The delivery runs beside the caller, who stops waiting at the deadline.
        worker = threading.Thread(target=deliver, name="lanectl-webhook", daemon=True)
        worker.start()
        worker.join(self.deadline_seconds + 0.5)
        if not outcome:
            return AlertDelivery(False, tries[0], f"webhook (${self.url_env}) gave no complete answer within the "
                                               f"{self.deadline_seconds:g} s delivery deadline; given up")
        return self._delivery(outcome[0], tries[0])

    @contextmanager
    def _http_client(self) -> Iterator[httpx.Client]:
        """The injected client, or one of our own for this send (closed after it)."""
        if self._client is not None:
            yield self._client
            return
        import httpx

        with httpx.Client(timeout=WEBHOOK_TIMEOUT_SECONDS) as client:
            yield client

    def _post(self, client: httpx.Client, url: str, body: dict[str, object], redaction: UrlRedaction,
              remaining: Callable[[], float]) -> _Answer:
        import httpx

        left = remaining()
        if left <= 0:
            return _Answer(error="no time left before the delivery deadline", failure="timed out")
        try:
            timeout = min(client.timeout.read or WEBHOOK_TIMEOUT_SECONDS, left)
            with client.stream("POST", url, json=body, timeout=timeout) as response:
                status = response.status_code
                text = _read_capped(response, remaining) if status >= 300 else ""
        except httpx.ConnectError as exc:
            return _Answer(error=_error_text(exc, redaction), failure="could not connect", retryable=True)
        except httpx.TimeoutException as exc:
            return _Answer(error=_error_text(exc, redaction), failure="timed out", retryable=True)
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:  # may be back in a second; a bad URL is not
            return _Answer(error=_error_text(exc, redaction), retryable=True)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            return _Answer(error=_error_text(exc, redaction), failure="is not a usable URL")
        except Exception as exc:  # an alert that cannot be sent must never stop the watchdog
            return _Answer(error=_error_text(exc, redaction))
        excerpt = redact_credentials(redaction.scrub(_one_line(text)))[:200] if status >= 300 else ""
        return _Answer(status=status, body_excerpt=excerpt, retryable=status == 429 or status >= 500)

    def _delivery(self, answer: _Answer, tries: int) -> AlertDelivery:
        webhook = f"webhook (${self.url_env})"
        after = f"after {tries} attempt{'s' if tries != 1 else ''}"
        if answer.status is None:
            return AlertDelivery(False, tries, f"{webhook} {answer.failure} ({answer.error}) {after}")
        if 200 <= answer.status < 300:
            return AlertDelivery(True, tries, f"{webhook} answered {answer.status} on attempt {tries}")
        detail = f"{webhook} answered {answer.status}"
        if answer.retryable:
            detail += f" {after}"
        elif 300 <= answer.status < 400:
            detail += " (a redirect: not followed, give the final URL)"
        else:
            detail += ", not retried"
        if answer.body_excerpt:
            detail += f": {answer.body_excerpt}"
        return AlertDelivery(False, tries, detail)

    def _log_retry(self, state: RetryCallState) -> None:
        import logging

        answer = state.outcome.result() if state.outcome else None
        if answer is None:
            what = "failed"
        elif answer.status is not None:
            what = f"answered {answer.status}"
        else:
            what = f"{answer.failure} ({answer.error})"
        pause = state.next_action.sleep if state.next_action else 0.0
        logging.getLogger(__name__).warning("webhook ($%s) %s; retrying in %.1f s (attempt %d of %d)",
                                            self.url_env, what, pause, state.attempt_number + 1, self.attempts)


class UrlRedaction:
    """Replaces a secret URL, and each part of it that could identify or unlock it, with `<redacted>`."""

    def __init__(self, url: str) -> None:
        import httpx

        parts = urllib.parse.urlsplit(url)
        candidates = {url, parts.netloc, parts.hostname or "", parts.path, parts.path.lstrip("/"), parts.query,
                      parts.password or "", parts.username or ""}
        # A webhook's error page may echo one piece of the path (the token alone) or one query value.
        candidates |= {segment for segment in parts.path.split("/") if len(segment) >= 8}
        candidates |= {value for _, value in urllib.parse.parse_qsl(parts.query)}
        try:  # httpx logs the URL as it normalised it (percent-encoded path, lower-case host)
            normalised = httpx.URL(url)
            candidates |= {str(normalised), normalised.host, normalised.raw_path.decode("ascii", "replace")}
        except (httpx.InvalidURL, UnicodeError):
            pass
        # Short fragments ("/", "a") would shred ordinary text; a token is never that short.
        fragments = sorted((text for text in candidates if len(text) >= 4), key=len, reverse=True)
        alternatives = "|".join(re.escape(text) for text in fragments)
        self._pattern = re.compile(alternatives, re.IGNORECASE) if fragments else None

    def __repr__(self) -> str:
        return "UrlRedaction(<redacted>)"

    def scrub(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern else text


class _RedactingFilter:
    """A log filter (logging takes any object with `filter(record)`), so this module need not import logging."""

    def __init__(self, redaction: UrlRedaction) -> None:
        self.redaction = redaction

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redaction.scrub(record.getMessage())
        record.args = ()
        return True


@contextmanager
def scrubbed_http_client_logs(redaction: UrlRedaction) -> Iterator[None]:
    """While a webhook request runs, every httpx/httpcore log record is scrubbed of the URL.

    A logger's filters see only the records logged on that very logger (not its children's), so each
    logger that can name a URL or host gets the filter.
    """
    import logging

    scrubber = _RedactingFilter(redaction)
    targets = [logging.getLogger(name) for name in HTTP_CLIENT_LOGGERS]
    for target in targets:
        target.addFilter(scrubber)
    try:
        yield
    finally:
        for target in targets:
            target.removeFilter(scrubber)


def _read_capped(response: httpx.Response, remaining: Callable[[], float]) -> str:
    """At most MAX_RESPONSE_BYTES of the body, and only until the deadline: the rest is not read."""
    kept = b""
    for chunk in response.iter_raw():
        kept += chunk[: MAX_RESPONSE_BYTES - len(kept)]
        if len(kept) >= MAX_RESPONSE_BYTES or remaining() <= 0:
            break
    return kept.decode("utf-8", errors="replace")


# Things in an error body that look like credentials: an Authorization value, `token=…`-style pairs
# (also as JSON), Slack/GitHub/AWS-style tokens, and long unbroken runs of key-like characters.
_CREDENTIALS = re.compile(
    r"(?i)\b(?:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|(?i:\b[\w-]*(?:token|secret|passw(?:or)?d|api[_-]?key|apikey|auth|signature|sig|key|credential)[\w-]*)"
    r"(?:\"?\s*[:=]\s*\"?)(?:(?:bearer|basic)\s+)?[^\s\"',;&]+"
    r"|\bxox[abposr]-[A-Za-z0-9-]+|\bgh[pousr]_[A-Za-z0-9]{20,}|\bAKIA[0-9A-Z]{16}\b"
    r"|\b[A-Za-z0-9_\-+/]{32,}={0,2}"
)


def redact_credentials(text: str) -> str:
    """`text` with whatever looks like a credential replaced by `<redacted>` (the name kept where there is one)."""

    def replace(found: re.Match[str]) -> str:
        pair = re.match(r"(?i)([\w-]+\"?\s*[:=]\s*\"?)", found[0])
        return f"{pair[1]}{REDACTED}" if pair and not found[0].lower().startswith(("bearer", "basic")) else REDACTED

    return _CREDENTIALS.sub(replace, text)


def _error_text(exc: BaseException, redaction: UrlRedaction) -> str:
    message = _one_line(str(exc))
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return redact_credentials(redaction.scrub(text))[:200]


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- node_exporter textfile metrics ---------------------------------------------------------------


@frozen
class WatchdogMetrics:
    lanes_up: dict[str, bool]  # lane -> passed its last check
    restarts_total: dict[str, int]  # lane -> restarts the watchdog made
    rollbacks_total: int
    xid_total: dict[int, int]  # Xid code -> lines seen
    xid_hardware_total: int
    last_pass_timestamp: float  # unix seconds
    last_pass_duration_seconds: float
    armed: bool
    heartbeat_timestamp: float  # unix seconds


METRIC_PREFIX = "lanectl_watchdog_"


def render_metrics(metrics: WatchdogMetrics) -> str:
    """The metrics in Prometheus text exposition format (0.0.4), families in a fixed order.

    A labelled family with no samples is left out entirely: a `# TYPE` line with nothing under it
    tells a reader nothing and some parsers reject it.
    """
    families: list[tuple[str, str, str, list[tuple[dict[str, str], float | int]]]] = [
        ("lane_up", "gauge", "Whether the lane passed its last watchdog check (1) or not (0).",
         [({"lane": lane}, int(up)) for lane, up in sorted(metrics.lanes_up.items())]),
        ("restarts_total", "counter", "Restarts of the lane made by the watchdog.",
         [({"lane": lane}, count) for lane, count in sorted(metrics.restarts_total.items())]),
        ("rollbacks_total", "counter", "Rollbacks to the last known-good lane made by the watchdog.",
         [({}, metrics.rollbacks_total)]),
        ("xid_total", "counter", "NVIDIA Xid kernel log lines seen, by Xid code.",
         [({"code": str(code)}, count) for code, count in sorted(metrics.xid_total.items())]),
        ("xid_hardware_total", "counter", "Xid lines whose code means the GPU hardware needs attention.",
         [({}, metrics.xid_hardware_total)]),
        ("last_pass_timestamp_seconds", "gauge", "Unix time the last watchdog pass finished.",
         [({}, metrics.last_pass_timestamp)]),
        ("last_pass_duration_seconds", "gauge", "How long the last watchdog pass took.",
         [({}, metrics.last_pass_duration_seconds)]),
        ("armed", "gauge", "Whether the watchdog is armed (1) or disarmed by a lease (0).",
         [({}, int(metrics.armed))]),
        ("heartbeat_timestamp_seconds", "gauge", "Unix time the watchdog last wrote these metrics.",
         [({}, metrics.heartbeat_timestamp)]),
    ]
    lines: list[str] = []
    for suffix, kind, help_text, samples in families:
        if not samples:
            continue
        name = METRIC_PREFIX + suffix
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{_label_set(labels)} {_sample_value(value)}")
    return "\n".join(lines) + "\n"


def escape_label_value(value: str) -> str:
    # The exposition format's only escapes inside a label value: backslash, double quote, line feed.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _label_set(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{escape_label_value(value)}"' for key, value in labels.items()) + "}"


def _sample_value(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class PrometheusTextfile:
    """The watchdog's metrics as a file for node_exporter's textfile collector (`--collector.textfile.directory`)."""

    def __init__(self, directory: Path | None, name: str = "lanectl.prom") -> None:
        if not name.endswith(".prom") or "/" in name:
            raise ValueError(f"a textfile collector file is a plain name ending in .prom, got {name!r}")
        self.directory = directory
        self.name = name

    def __repr__(self) -> str:
        return f"PrometheusTextfile(directory={self.directory!r}, name={self.name!r})"

    @property
    def path(self) -> Path | None:
        return self.directory / self.name if self.directory is not None else None

    def write(self, metrics: WatchdogMetrics) -> None:
        """Replace the file whole; no-op without a directory. Raises `OperationFailed` if it cannot be written.

        node_exporter reads the folder whenever it is scraped, so a half-written file would be a
        scrape error: the text goes to a temp file in the same folder (named so the collector, which
        reads only `*.prom`, skips it), then `os.replace` swaps it in.
        """
        if self.directory is None:
            return
        target = self.directory / self.name
        try:
            # 0644: node_exporter usually runs as its own user.
            write_atomically(target, render_metrics(metrics).encode(), mode=0o644)
        except OSError as exc:
            raise OperationFailed(f"could not write metrics to {target}: {exc.strerror or exc}") from exc
