"""Imported first by every service module that needs the `serve` extra: without it, importing them raises
`judges.extras.MissingExtraError` (an ImportError) naming `pip install 'ruler-rl[serve]'` instead of a bare
ModuleNotFoundError. (`ruler.service.store`, which `ruler keys` uses, needs no extra and does not import it.)"""

from judges.extras import require

require("serve", "the judging service (ruler.service)")
