"""nginx config import (gateway/nginxconf): grammar, translation, the corpus in nginx_corpus/."""
