package dev.correx;

/** An approver's answer. */
public enum Decision {
    /** Denies the run. */
    DENY(0),
    /** Approves this run. */
    APPROVE(1),
    /**
     * Approves this run and, for the rest of its session, every run of the same tool whose
     * argv starts with this one's.
     */
    APPROVE_FOR_SESSION(2),
    /**
     * Defers the run to a durable decision: the request is recorded and waits for
     * {@link Approvals#decideJson} from any process; a session step throws
     * {@link PendingException}, and asked again after the decision it runs (or is denied)
     * without asking this approver.
     */
    DEFER(3);

    final int code;

    Decision(int code) {
        this.code = code;
    }
}
