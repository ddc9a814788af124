-- Signals delivered to a task, kept until a wait consumes them (or refuses them), so a
-- signal sent before its wait is not lost. signal_id deduplicates redelivery; the payload
-- is also kept as its exact canonical text, which redelivery is compared against.
CREATE TABLE runifold_signals (
    task_id TEXT NOT NULL,
    signal_id TEXT NOT NULL,
    name TEXT NOT NULL,
    payload JSONB NOT NULL,
    payload_text TEXT NOT NULL,
    sender TEXT NOT NULL,
    reason TEXT,
    sent_at TIMESTAMPTZ NOT NULL,
    consumed_at TIMESTAMPTZ,
    PRIMARY KEY (task_id, signal_id)
);

CREATE INDEX runifold_signals_pending ON runifold_signals (task_id, name, sent_at)
    WHERE consumed_at IS NULL;

-- The signal a waiting task waits for: a matching delivery makes it claimable at once.
ALTER TABLE runifold_tasks ADD COLUMN waiting_for_signal TEXT;

-- Set by cancel() on a leased task; its worker learns it from the heartbeat.
ALTER TABLE runifold_tasks ADD COLUMN cancel_requested TEXT;
