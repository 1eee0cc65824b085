package dev.correx;

/** Decides whether a T2 or T3 tool may run (see {@link Runtime#setApprover}). */
@FunctionalInterface
public interface Approver {
    /** The decision; an exception (or null) denies. */
    Decision decide(ApprovalRequest request) throws Exception;
}
