-- 0001: the ateapi store. Every record is a JSONB document (the whole model record,
-- metadata included) plus the columns we look it up, order it or constrain it by.
-- Names use the "C" collation so the database orders them the way Python does.

CREATE TABLE atespaces (
    name    text COLLATE "C" PRIMARY KEY,
    uid     text   NOT NULL,
    version bigint NOT NULL,
    doc     jsonb  NOT NULL
);

CREATE TABLE actor_templates (
    atespace text COLLATE "C" NOT NULL REFERENCES atespaces (name),
    name     text COLLATE "C" NOT NULL,
    uid      text   NOT NULL,
    version  bigint NOT NULL,
    doc      jsonb  NOT NULL,
    PRIMARY KEY (atespace, name)
);

CREATE TABLE actors (
    atespace text COLLATE "C" NOT NULL REFERENCES atespaces (name),
    name     text COLLATE "C" NOT NULL,
    uid      text   NOT NULL UNIQUE,
    version  bigint NOT NULL,
    state    text   NOT NULL,
    doc      jsonb  NOT NULL,
    PRIMARY KEY (atespace, name)
);

CREATE INDEX actors_state_idx ON actors (state);

CREATE TABLE tags (
    atespace text COLLATE "C" NOT NULL REFERENCES atespaces (name),
    name     text COLLATE "C" NOT NULL,
    uid      text   NOT NULL,
    version  bigint NOT NULL,
    doc      jsonb  NOT NULL,
    PRIMARY KEY (atespace, name)
);

CREATE TABLE workers (
    name    text COLLATE "C" PRIMARY KEY,
    uid     text   NOT NULL,
    version bigint NOT NULL,
    state   text   NOT NULL,
    node    text   NOT NULL,
    pool    text   NOT NULL,
    doc     jsonb  NOT NULL
);

CREATE INDEX workers_node_idx ON workers (node);

-- One booking per actor (by uid); a worker's allocated is the sum of its rows here.
CREATE TABLE actor_bindings (
    actor_uid text PRIMARY KEY REFERENCES actors (uid),
    worker    text COLLATE "C" NOT NULL REFERENCES workers (name) ON DELETE CASCADE,
    doc       jsonb NOT NULL
);

CREATE INDEX actor_bindings_worker_idx ON actor_bindings (worker);

-- Worker change feed: each change writes a row here in its own transaction and
-- NOTIFYs its seq; listeners read the row named by each notification, in the order
-- the notifications arrive (commit order). Old rows are pruned by the writers.
CREATE TABLE worker_events (
    seq        bigserial PRIMARY KEY,
    kind       text   NOT NULL,
    name       text   NOT NULL,
    version    bigint NOT NULL,
    doc        jsonb  NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX worker_events_created_at_idx ON worker_events (created_at);

CREATE TABLE leases (
    key        text COLLATE "C" PRIMARY KEY,
    token      text        NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX leases_expires_at_idx ON leases (expires_at);
