package dev.correx;

/**
 * A session step's run waits for a durable approval decision: nothing ran. The message names
 * the request; decide it ({@link Approvals#decideJson}, {@code correx approvals decide}) from
 * any process, then call the step again.
 */
public class PendingException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public PendingException(int code, String message) {
        super(code, message);
    }
}
