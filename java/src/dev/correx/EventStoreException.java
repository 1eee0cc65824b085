package dev.correx;

/** The event log failed (I/O, corruption, locked too long). */
public class EventStoreException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public EventStoreException(int code, String message) {
        super(code, message);
    }
}
