from ckptplan.cli import main

main()
