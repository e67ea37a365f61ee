from ckptplan.cli.main import main

main()
