package dev.correx;

/** What an append expects of its stream, for optimistic concurrency. */
public final class ExpectedVersion {
    final int kind;
    final long version;

    private ExpectedVersion(int kind, long version) {
        this.kind = kind;
        this.version = version;
    }

    private static final ExpectedVersion ANY = new ExpectedVersion(0, 0);
    private static final ExpectedVersion NO_STREAM = new ExpectedVersion(1, 0);

    /** Append whatever the stream holds. */
    public static ExpectedVersion any() {
        return ANY;
    }

    /** The stream must not exist yet. */
    public static ExpectedVersion noStream() {
        return NO_STREAM;
    }

    /** The stream's last version must be {@code version}. */
    public static ExpectedVersion exact(long version) {
        if (version < 0) {
            throw new InvalidArgumentException(CorrexException.E_INVALID_ARGUMENT, "a stream version is never negative");
        }
        return new ExpectedVersion(2, version);
    }

    @Override
    public String toString() {
        return kind == 0 ? "any" : kind == 1 ? "no stream" : "exactly " + version;
    }
}
