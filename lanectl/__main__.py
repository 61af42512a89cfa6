from lanectl.cli.app import main

main()
