-- Stored responses of the Responses API (gateway/responses_store.py): what
-- GET /v1/responses/{id} answers, and what a request naming previous_response_id continues.
--
-- A row belongs to the rate-limit subject that created it: `team:<id>` for a team's keys,
-- `ip:<address>` for the anonymous free tier; every read filters by it, so another
-- tenant's id is simply not found. A team's rows go with the team. Rows expire (30 days
-- for teams, 1 day for the free tier, set by the gateway at insert); expired rows are
-- never read and are deleted a batch at a time as new ones are stored.
--
-- JSON is kept as text, not jsonb: jsonb refuses the \u0000 escape, which a client's
-- text may hold, and nothing here queries inside the documents.
CREATE TABLE responses (
    id             text PRIMARY KEY,
    owner          text NOT NULL,
    team_id        bigint REFERENCES teams (id) ON DELETE CASCADE,
    -- the response this one continues; its chain is walked by id and owner (no foreign
    -- key: an ancestor may expire or be deleted, which ends the chain there)
    previous_id    text,
    -- this turn's input messages, [{"role", "content"}], as the chat template gets them
    input          text NOT NULL,
    -- the assistant's answer, as the next turn replays it
    output_text    text NOT NULL,
    -- the response object as answered
    body           text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX responses_expires ON responses (expires_at);
CREATE INDEX responses_team ON responses (team_id) WHERE team_id IS NOT NULL;
