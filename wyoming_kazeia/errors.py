"""The one error family of Kazeia TTS.

Every error the package raises on purpose is a `KazeiaError`, so a command line catches one base
and prints its one-line message. Each class also derives from the builtin that says what kind of
failure it is (`ValueError` for bad input, `RuntimeError` for a failed computation, ...), so
callers that catch those keep working.

    KazeiaError
    ├── ModelError          a model file or folder that cannot be used (native errors too)
    ├── InputError          an engine input rejected by the native engine (shape, range, id)
    ├── ConversionError     a checkpoint the converter cannot read or serve
    ├── ModelNotFoundError  --model names nothing that can be found or downloaded
    ├── TokenizerError      tokenizer files missing or unreadable
    ├── SettingsError       an invalid setting
    ├── VoiceError          an unknown voice, speaker or language
    ├── EngineError         a synthesis failed (the engine stays usable)
    ├── ServiceBusyError    the queue in front of the engine is full
    ├── NotReadyError       the model is still being downloaded, converted or loaded
    ├── SlowClientError     a client left too much audio unread: its synthesis is cancelled
    ├── ProtocolError       a malformed Wyoming event (answered, then the connection closes)
    ├── SsmlError           a text said to be SSML that is malformed (a bad-request)
    └── RequestError        an HTTP request the HTTP API refuses (its status and code said)

The native extension raises `ModelError` and `InputError` as these very classes (its module
initialisation looks them up here), so a C++ error reaches Python already in the family.
"""

from __future__ import annotations


class KazeiaError(Exception):
    """Base of every error Kazeia TTS raises on purpose."""


class ModelError(KazeiaError, RuntimeError):
    """A model file that cannot be used: missing, corrupt, truncated or of the wrong kind."""


class InputError(KazeiaError, ValueError):
    """An input the engine rejects (shape, dtype, range, unknown speaker or language)."""


class ConversionError(KazeiaError, ValueError):
    """A checkpoint that cannot be converted."""


class ModelNotFoundError(KazeiaError, FileNotFoundError):
    """--model names no converted model, checkpoint or downloadable repo."""


class TokenizerError(KazeiaError, ValueError):
    """Tokenizer files that are missing or cannot be read."""


class SettingsError(KazeiaError, ValueError):
    """An invalid setting; the message names it and its allowed values."""


class VoiceError(KazeiaError, ValueError):
    """An unknown voice, speaker or language; the message lists the valid ones."""


class EngineError(KazeiaError, RuntimeError):
    """A synthesis failed (e.g. the decoder subprocess crashed); the engine stays usable."""


class ServiceBusyError(KazeiaError, RuntimeError):
    """The queue in front of the engine is full."""


class SlowClientError(KazeiaError, RuntimeError):
    """A client read none of a bounded amount of audio: its synthesis is cancelled."""


class NotReadyError(KazeiaError, RuntimeError):
    """The service has no model yet (first start: download, conversion, loading, warm-up)."""


class ProtocolError(KazeiaError, ValueError):
    """Malformed input: answered with an `error`, then the connection is closed."""


class SsmlError(KazeiaError, ValueError):
    """A text said to be SSML that is not well-formed, or a bad <break>: a `bad-request`."""


class RequestError(KazeiaError, ValueError):
    """An HTTP request the HTTP API refuses for a reason of HTTP's own (an unknown path, a
    missing API key, a body too large or not JSON, a field of the wrong type): its `status`,
    OpenAI error `code` and the request field (`param`) it is about."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        code: str = "invalid_request",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


# What an error text or a log line quotes of a client's input at most: a request's size must
# never decide a log line's.
QUOTE_CHARS = 200


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """`value` as an error text quotes it (its repr), cut to `limit` characters with its
    length said when longer."""
    text = repr(value)
    if len(text) <= limit:
        return text
    length = f", {len(value)} characters" if isinstance(value, str | bytes) else ""
    return f"{text[:limit]}... (cut{length})"
