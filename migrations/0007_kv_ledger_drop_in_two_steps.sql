-- A ledger drop now clears tier bits first and deletes the rows left with none second, two
-- statements in one transaction (tiering/ledger.py, Ledger.drop).
--
-- It used to decide "delete the row" or "clear the bit" in one statement, on that
-- statement's snapshot: a row changed meanwhile (a worker recording its NAS copy, another
-- drop) was re-checked by the branch that had matched it, failed that branch, and was
-- never seen by the other, so it kept a bit whose data tierd had just deleted. The UPDATE
-- `tiers = tiers & ~bit` applies to each row as it is once locked; between it and the
-- DELETE of `tiers = 0` a row may hold no tier, which the old CHECK (tiers > 0) refused.
-- No transaction commits such a row.
--
-- Every existing row meets the old, stricter check, so the new one is added NOT VALID:
-- enforced on every write from now on, without re-scanning the table under this lock.
ALTER TABLE kv_ledger DROP CONSTRAINT kv_ledger_tiers_check;
ALTER TABLE kv_ledger ADD CONSTRAINT kv_ledger_tiers_check CHECK (tiers >= 0) NOT VALID;
