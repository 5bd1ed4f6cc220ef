"""The root of the runtime's exceptions.

Every exception the runtime defines derives from :class:`StreamRuntimeError`, so that a
caller can catch all of them at once. Each also keeps the builtin base its callers catch
(``ValueError``, ``ConnectionError``, ...), and lives in the module that raises it::

    StreamRuntimeError
    ├── ValueError: what was given is wrong
    │   ├── dataflow.DataflowError        a job graph that cannot run
    │   ├── dataflow.JobRefError          a job reference that resolves to no job
    │   ├── params.ParamError             a job parameter unknown or of the wrong type
    │   ├── codec.CodecError              bytes that do not decode, an object that won't encode
    │   ├── codeload.CodeError            uploaded code that cannot be installed or resolved
    │   ├── jobbuild.BuildError           a job that does not build
    │   └── messages.MessageError         a frame that is not a control message
    │       ├── messages.UnknownMessage   ... of no type, or of a type not expected
    │       └── messages.MalformedMessage ... with fields missing, extra or mistyped
    ├── TypeError
    │   └── keygroups.UnsupportedKeyError a key of a type with no stable hash
    ├── KeyError
    │   └── state.KeyGroupNotOwnedError   state of a key group the task does not own
    ├── ConnectionError: a peer or the wire
    │   ├── protocol.FrameError           a frame too long or undecodable
    │   ├── handshake.HandshakeError      a peer that did not prove it holds the key
    │   └── channels.ChannelError         a data connection that broke, or a peer that lied
    └── RuntimeError: a step that cannot go on
        ├── alignment.AlignmentError      an event a correct caller never produces
        ├── operators.UserCodeError       the job's own code raised
        ├── change.WorkerReconfigurationError
        │                                 a reconfiguration step this worker cannot take
        ├── partitioned.SourceStalled     a partition unreadable past its stall_timeout_s
        └── registration.RegistrationRefused
                                          the coordinator would not take this worker

The builtin in each branch is a second base, not a class of the tree: ``except
ValueError`` catches a :class:`~runtime.codec.CodecError` as it always did, and ``except
StreamRuntimeError`` catches every one above.
"""

from __future__ import annotations

__all__ = ["StreamRuntimeError"]


class StreamRuntimeError(Exception):
    """Base of every exception the runtime defines."""
