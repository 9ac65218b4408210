-- What a lock role needs on a schema a DBA created with schema.sql: run as the schema's owner,
--   psql -v role=app -v ON_ERROR_STOP=1 -f grants.sql DBNAME
-- The role can then call the functions, which alone read and write the tables.
GRANT USAGE ON SCHEMA lockkit TO :"role";
GRANT SELECT ON lockkit.schema_version TO :"role";
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lockkit TO :"role";
