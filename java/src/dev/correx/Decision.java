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
    APPROVE_FOR_SESSION(2);

    final int code;

    Decision(int code) {
        this.code = code;
    }
}
