-- Version 25: flow control whose cost per claim does not grow with the running tasks or
-- with a rate's window. Each rated group's claims are numbered (seq, one more than the
-- group's last), so the claims in a window are the last number less the first one in it
-- (two index probes) instead of a count of every row in the window. The numbers of the
-- claims kept so far, in their order; the indexes follow in common/0025_flow_at_scale.sql.
ALTER TABLE runifold_flow_claims ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;

UPDATE runifold_flow_claims c SET seq = n.seq
FROM (
    SELECT ctid AS row_id, ROW_NUMBER() OVER (PARTITION BY scope, name ORDER BY at) AS seq
    FROM runifold_flow_claims
) n
WHERE c.ctid = n.row_id;
