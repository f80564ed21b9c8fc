"""python -m swarm.config: regenerate configs/swarm.schema.json."""

import json

from swarm.config.schema import json_schema, schema_path

schema_path().write_text(json.dumps(json_schema(), indent=2) + "\n")
print(f"wrote {schema_path()}")
