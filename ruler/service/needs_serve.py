"""Imported first by every service module that needs the `serve` extra: without it, importing them raises
`ruler_rl.judges.extras.MissingExtraError` (an ImportError) naming `pip install 'ruler-rl[serve]'` instead of a bare
ModuleNotFoundError. (`ruler_rl.service.store`, which `ruler keys` uses, needs no extra and does not import it.)"""

from ruler_rl.judges.extras import require

require("serve", "the judging service (ruler_rl.service)")
