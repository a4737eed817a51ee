import sys
import draftsman.models.base as b
b.AMX_ATTENTION_ROWS = int(sys.argv[1])  # the AMX limit (16: as before it existed)
from draftsman.cli.main import main
sys.argv = ["draftsman", "profile", "--target", "qwen2.5-coder-1.5b-instruct", "--dtype", "q4", "--threads", "2",
            "--lengths", "1,16,17,24,32,48", "--context", "256", "--repeats", "5", "--json"]
main()
